"""Bounds on what arrives from outside: size, depth, numbers and text.

Everything a broker writer, a worker in another language, a tenant or an HTTP caller sends is
untrusted. Such a value can parse as JSON and still be unusable: a number the store cannot
hold (`NaN`, `Infinity`, `1e20` where a BIGINT goes), a lone surrogate (`"\\ud800"`, which no
UTF-8 encoder accepts, so the store write fails), a NUL in a value that reaches a PostgreSQL
text column, a nesting deep enough to exhaust Python's recursion (`'[' * 200000` raises
`RecursionError`, which is not a `ValueError` and escapes ordinary parsers), or simply a
hundred megabytes. A message like that must be refused at the boundary, once, with a clear
reason — not retried forever because its store write keeps failing.

The checks here are pure functions (no I/O) so every boundary can share them: the transports
check a message's bytes before parsing it, the wire parsers check its numbers and strings,
and the engine checks payloads given through its API. Each raises `PayloadRejectedError`
(a `ValueError`) naming what was being read and why.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

from durably._core.errors import DurablyError

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_WIRE_INT",
    "PayloadRejectedError",
    "PayloadTooLargeError",
    "check_json_value",
    "check_size",
    "check_text",
    "check_wire_int",
    "loads_untrusted",
]

DEFAULT_MAX_PAYLOAD_BYTES: Final = 4 * 1024 * 1024
"""The default of `max_payload_bytes`: 4 MiB of JSON per step result, step event, decision
or signal payload. Large enough for any ordinary value; a workflow that moves bigger data
should pass a reference to it (a URL, an object-store key) instead."""

MAX_JSON_DEPTH: Final = 128
"""Deepest nesting accepted in an untrusted JSON value. Python's own parser and encoder
recurse per level; far below the interpreter's recursion limit, far above any real payload."""

MAX_WIRE_INT: Final = 2**53 - 1
"""Largest integer a wire field (`seq`, `attempt`, `startedAt`, …) may carry: the largest
integer a JavaScript worker represents exactly, and well inside PostgreSQL's BIGINT."""

# A lone surrogate cannot be encoded as UTF-8: a string holding one makes every store write
# (and every later JSON encode with ensure_ascii=False) fail.
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


class PayloadRejectedError(DurablyError, ValueError):
    """A value from outside is refused at the boundary: malformed, too deep, a number or a
    string the store cannot hold. `what` names the value (`"step result output"`), `problem`
    says why."""

    def __init__(self, what: str, problem: str):
        super().__init__(f"{what} refused: {problem}")
        self.what = what
        self.problem = problem


class PayloadTooLargeError(PayloadRejectedError):
    """A value from outside is bigger than `max_payload_bytes` allows."""

    def __init__(self, what: str, size: int, limit: int):
        super().__init__(
            what, f"{size} bytes is over the limit of {limit} bytes (max_payload_bytes)"
        )
        self.size = size
        self.limit = limit


def check_size(what: str, size: int, limit: int) -> None:
    """Raise `PayloadTooLargeError` when `size` bytes is over `limit`."""
    if size > limit:
        raise PayloadTooLargeError(what, size, limit)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_untrusted(
    raw: str | bytes | bytearray,
    *,
    what: str,
    max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Parse untrusted JSON text: at most `max_bytes`, no `NaN`/`Infinity`, at most
    `max_depth` levels, no lone surrogates. Never raises anything but
    `PayloadRejectedError` (a `RecursionError` from a deep nesting is turned into one)."""
    if isinstance(raw, (bytes, bytearray)):
        check_size(what, len(raw), max_bytes)
    elif len(raw) * 4 > max_bytes:  # a UTF-8 character is at most 4 bytes: measure only then
        check_size(what, _utf8_len(raw), max_bytes)
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        raise PayloadRejectedError(what, f"nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadRejectedError(what, f"not JSON ({exc})") from None
    check_json_value(what, value, max_depth=max_depth)
    return value


def _utf8_len(text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return len(text.encode("utf-8", "surrogatepass"))


def check_json_value(what: str, value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise `PayloadRejectedError` unless `value` is plain JSON data the store can hold:
    dicts with string keys, lists, strings without lone surrogates, finite numbers, bools and
    None, nested at most `max_depth` levels. Iterative, so a deep value cannot exhaust the
    interpreter's recursion while being checked."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item is None or isinstance(item, (bool, int)):
            continue
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise PayloadRejectedError(what, "a string holds a lone surrogate")
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise PayloadRejectedError(what, f"{item!r} is not a JSON number")
            continue
        if depth >= max_depth:
            raise PayloadRejectedError(what, f"nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise PayloadRejectedError(what, f"object key {key!r} is not a string")
                if _SURROGATE.search(key):
                    raise PayloadRejectedError(what, "an object key holds a lone surrogate")
                stack.append((child, depth + 1))
            continue
        if isinstance(item, (list, tuple)):
            stack.extend((child, depth + 1) for child in item)
            continue
        raise PayloadRejectedError(what, f"{type(item).__name__} is not a JSON value")


def check_text(what: str, value: str, *, max_len: int | None = None) -> str:
    """Refuse a string that would reach a text column and cannot be stored there: a NUL
    (PostgreSQL text refuses it), a lone surrogate (not encodable), or longer than
    `max_len` characters. Returns the value."""
    if "\x00" in value:
        raise PayloadRejectedError(what, "holds a NUL character")
    if _SURROGATE.search(value):
        raise PayloadRejectedError(what, "holds a lone surrogate")
    if max_len is not None and len(value) > max_len:
        raise PayloadRejectedError(what, f"is {len(value)} characters, over {max_len}")
    return value


def check_wire_int(what: str, value: int, *, maximum: int = MAX_WIRE_INT) -> int:
    """Refuse a wire integer beyond `maximum` (default 2**53 - 1). Returns the value."""
    if value > maximum:
        raise PayloadRejectedError(what, f"{value} is over {maximum}")
    return value
