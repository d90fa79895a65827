"""Query parameters of the console's API, read strictly.

`run_query_kwargs(params)` turns a request's repeatable filter parameters into the keyword
filters of `RunQuery` (what `Engine.list_runs(**query)` and friends take). A repeated parameter
is a set and a blank filter value means "no restriction on that field", but everything else
that cannot be read exactly as written is a `BadRequest` (400) naming the parameter: a
malformed `attr`, an unknown status, a number that is not a plain integer in range, a boolean
that is not true/false/1/0, a parameter the endpoint does not know. A filter that was dropped
instead would widen the query — and a bulk action on a wider query cancels or retries runs
nobody meant to touch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

from durably._core.models import RUN_STATUSES

__all__ = [
    "ATTR_OPS",
    "DEFAULT_LIMIT",
    "FILTER_PARAMS",
    "MAX_LIMIT",
    "MAX_OFFSET",
    "PAGE_PARAMS",
    "VALUE_FIELDS",
    "BadRequest",
    "MultiParams",
    "boolean",
    "check_known",
    "coerce_attr_value",
    "integer",
    "page",
    "parse_attr",
    "run_query_kwargs",
    "value_facet_request",
]

ATTR_OPS = ("eq", "ne", "gt", "gte", "lt", "lte")
#: Column/tag axes `GET runs/values?field=` accepts besides `attr.<key>`.
VALUE_FIELDS = frozenset({"workflow", "status", "origin", "namespace", "tag", "attributeKey"})
#: The run filters every list-like route shares.
FILTER_PARAMS = frozenset(
    {"status", "workflow", "namespace", "tag", "origin", "unattributed", "attr"}
)
PAGE_PARAMS = frozenset({"limit", "offset"})
#: A page the client did not size. 20,000 rows of an unbounded list were 3.6 MB: a default
#: keeps an absent `limit` cheap, the cap keeps a large one bounded.
DEFAULT_LIMIT = 50
MAX_LIMIT = 1_000
#: Offsets beyond this are refused rather than passed to the database, where a 64-bit
#: overflow was a 500; no console pages through two billion runs.
MAX_OFFSET = 2**31 - 1
VALUE_LIMIT_DEFAULT = 100
_INTEGER = re.compile(r"[0-9]{1,12}")  # ASCII digits only: Python's isdigit() accepts "²"
_TRUE = ("true", "1")
_FALSE = ("false", "0")


class MultiParams(Protocol):
    """What Starlette's `QueryParams` offers."""

    def getlist(self, key: str) -> list[str]: ...

    def keys(self) -> Iterable[str]: ...


class BadRequest(Exception):
    """A 400 answer with this message."""


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(f"`{n}`" for n in sorted(names))


def check_known(params: MultiParams, allowed: Collection[str]) -> None:
    """A parameter this endpoint does not read is refused: a typo (`tga=x` for `tag=x`) must
    not leave the query wider than the caller meant."""
    unknown = {key for key in params.keys() if key not in allowed}
    if unknown:
        accepted = _quoted(allowed) if allowed else "no query parameters"
        raise BadRequest(
            f"Unknown query parameter {_quoted(unknown)}: this endpoint takes {accepted}."
        )


def _values(params: MultiParams, key: str) -> list[str]:
    """The distinct non-blank values of a repeatable filter (blank = no restriction)."""
    out: list[str] = []
    for value in params.getlist(key):
        if value.strip() == "":
            continue
        if value not in out:
            out.append(value)
    return out


def _single(params: MultiParams, key: str) -> str | None:
    values = params.getlist(key)
    if len(values) > 1:
        raise BadRequest(f"Query parameter `{key}` is given {len(values)} times; give it once.")
    return values[0] if values else None


def integer(params: MultiParams, key: str, *, default: int, low: int, high: int) -> int:
    """A plain decimal integer in [low, high]; `default` when absent; anything else → 400."""
    text = _single(params, key)
    if text is None:
        return default
    value = int(text) if _INTEGER.fullmatch(text) else None
    if value is None or not low <= value <= high:
        raise BadRequest(
            f"Query parameter `{key}` must be an integer from {low} to {high}, got {text!r}."
        )
    return value


def boolean(params: MultiParams, key: str) -> bool | None:
    """`true`/`1` → True, `false`/`0` → False, absent → None; anything else → 400 (a
    `compensate=yes` silently read as false would cancel without compensating)."""
    text = _single(params, key)
    if text is None:
        return None
    folded = text.strip().lower()
    if folded in _TRUE:
        return True
    if folded in _FALSE:
        return False
    raise BadRequest(f"Query parameter `{key}` must be true or false, got {text!r}.")


def page(
    params: MultiParams, *, default: int = DEFAULT_LIMIT, maximum: int = MAX_LIMIT
) -> tuple[int, int]:
    """(limit, offset): limit 1..maximum (default `default`), offset 0..MAX_OFFSET."""
    limit = integer(params, "limit", default=default, low=1, high=maximum)
    offset = integer(params, "offset", default=0, low=0, high=MAX_OFFSET)
    return limit, offset


def coerce_attr_value(text: str) -> bool | int | float | str:
    """`true`/`false` → bool, a non-empty numeric string → number, else the string."""
    if text == "true":
        return True
    if text == "false":
        return False
    if text.strip() != "":
        try:
            number = float(text)
        except ValueError:
            return text
        if not math.isfinite(number):
            return text
        if number.is_integer() and "." not in text and "e" not in text.lower():
            return int(number)
        return number
    return text


def parse_attr(entry: str) -> dict[str, Any]:
    """`key:op:value` (the value keeps its colons) → an attribute filter; 400 if malformed."""
    key, sep, rest = entry.partition(":")
    op, sep2, value = rest.partition(":")
    if not sep or not sep2 or not key.strip() or op not in ATTR_OPS:
        raise BadRequest(
            f"Malformed `attr` filter {entry!r}: write key:op:value with op one of "
            f"{', '.join(ATTR_OPS)} (e.g. attr=customer:eq:42)."
        )
    return {"key": key, "op": op, "value": coerce_attr_value(value)}


def _one_or_many(out: dict[str, Any], values: Sequence[Any], one: str, many: str) -> None:
    if len(values) == 1:
        out[one] = values[0]
    elif values:
        out[many] = list(values)


def run_query_kwargs(params: MultiParams) -> dict[str, Any]:
    """The `RunQuery` filter keywords of a request's flat filters (no paging)."""
    out: dict[str, Any] = {}
    statuses = _values(params, "status")
    unknown = [s for s in statuses if s not in RUN_STATUSES]
    if unknown:
        raise BadRequest(
            f"Unknown `status` {', '.join(map(repr, unknown))}: use {', '.join(RUN_STATUSES)}."
        )
    _one_or_many(out, statuses, "status", "statuses")
    _one_or_many(out, _values(params, "workflow"), "workflow", "workflows")
    _one_or_many(out, _values(params, "namespace"), "namespace", "namespaces")
    _one_or_many(out, _values(params, "tag"), "tag", "tags")
    origins: list[str | None] = list(_values(params, "origin"))
    if boolean(params, "unattributed"):
        origins.append(None)
    _one_or_many(out, origins, "origin", "origins")
    attributes = [parse_attr(entry) for entry in params.getlist("attr") if entry.strip()]
    if attributes:
        out["attributes"] = attributes
    return out


_DROPPED_FOR_FIELD: Mapping[str, tuple[str, ...]] = {
    "workflow": ("workflow", "workflows"),
    "status": ("status", "statuses"),
    "origin": ("origin", "origins"),
    "namespace": ("namespace", "namespaces"),
    "tag": ("tag", "tags"),
    "attributeKey": ("attributes",),
}
VALUE_PARAMS = FILTER_PARAMS | PAGE_PARAMS | {"field", "groupByCount[field]", "groupByCount[limit]"}


def value_facet_request(
    params: MultiParams,
) -> tuple[dict[str, Any], dict[str, Any], int, int]:
    """`GET runs/values`: (axis, filters minus the enumerated field's predicates, limit,
    offset). Raises `BadRequest` for a missing or unknown field or a bad parameter."""
    check_known(params, VALUE_PARAMS)
    field = _single(params, "field") or _single(params, "groupByCount[field]")
    if field is None or field.strip() == "":
        raise BadRequest("Query parameter `field` is required.")
    if params.getlist("limit"):
        limit, offset = page(params, default=VALUE_LIMIT_DEFAULT)
    else:
        limit = integer(
            params, "groupByCount[limit]", default=VALUE_LIMIT_DEFAULT, low=1, high=MAX_LIMIT
        )
        offset = integer(params, "offset", default=0, low=0, high=MAX_OFFSET)
    query = run_query_kwargs(params)
    if field.startswith("attr.") and len(field) > len("attr."):
        key = field[len("attr.") :]
        axis: dict[str, Any] = {"field": "attributeValue", "key": key}
        kept = [a for a in query.get("attributes", ()) if a["key"] != key]
        if kept:
            query["attributes"] = kept
        else:
            query.pop("attributes", None)
        return axis, query, limit, offset
    if field not in VALUE_FIELDS:
        raise BadRequest(
            f"Unknown `field` {field!r}: use one of {', '.join(sorted(VALUE_FIELDS))} or "
            "attr.<key>."
        )
    for name in _DROPPED_FOR_FIELD[field]:
        query.pop(name, None)
    return {"field": field}, query, limit, offset
