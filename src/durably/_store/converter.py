"""The data converter: where the payloads are in every value the store contract carries.

A payload is a user's JSON value: a run's input and output, a checkpoint's input and output,
a buffered signal's or event's payload, and a bare payload parameter (`Payload`, e.g. the
`(token, payload)` pairs of `deliver_signals`). A `Codec` (`AesGcmCodec`) turns one payload
into another JSON value at rest and back. `DataConverter` applies a codec to exactly the
payloads inside a value of a given TYPE, found from the annotation alone:

- `Annotated[JSONValue, PAYLOAD]` (`Payload`): the value itself is a payload;
- a dataclass or TypedDict: its fields, typed by their annotations, except that the models
  whose JSON fields predate the `Payload` marker are described by two tables here:
  `PAYLOAD_FIELDS` (encoded) and `CLEAR_FIELDS` (JSON kept readable on purpose: an error's
  `details` for the console and onError routing, a step event's `data`, a query's `origin`);
- `X | None`, `list[X]`, `Sequence[X]`, `tuple[X, ...]`, `tuple[A, B]`, `dict[str, X]`:
  applied to what they hold;
- scalars, dates, `Literal`s, enums, and the handle types in `HANDLES`: carry no payload.

Anything else is REFUSED with a `TypeError` naming where it was found — an unmarked JSON value
(`Any`), an unknown class, a union of two payload-carrying types, a dataclass with a JSON
field neither table names: the converter cannot tell whether it holds a payload, and guessing
wrong would write cleartext. Each type is classified once; what remains is a `Transform`, a
plain function applied per value (types without payloads get None: nothing to do at all).

`None` never reaches the codec and stays None; a value without a payload is returned as is
(the same object), so a run without input or output costs no copy.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import date, datetime, timedelta
from enum import Enum
from typing import (
    Annotated,
    Any,
    Literal,
    Protocol,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
    runtime_checkable,
)

from durably._core.models import (
    BufferedEvent,
    BufferedSignal,
    JSONValue,
    RunPatch,
    RunQuery,
    StepCheckpoint,
    StepError,
    StepEvent,
    WorkflowRun,
    replace,
)
from durably._core.schedules import ScheduleSpec
from durably._store.protocol import PAYLOAD, InstanceHold, WakeBus

__all__ = [
    "CLEAR_FIELDS",
    "HANDLES",
    "PAYLOAD_FIELDS",
    "Codec",
    "CodecError",
    "DataConverter",
    "Leaf",
    "Transform",
    "transform_for",
]

_T = TypeVar("_T")


@runtime_checkable
class Codec(Protocol):
    """`decode(encode(v)) == v` for every JSON value `v` other than None.
    The encoded form must itself be JSON (it is stored in the payload's JSON column)."""

    def encode(self, value: JSONValue) -> JSONValue: ...
    def decode(self, value: JSONValue) -> JSONValue: ...


class CodecError(ValueError):
    """A stored value could not be decoded (wrong key, tampered or foreign data)."""


Leaf = Callable[[JSONValue], JSONValue]
"""One direction of a codec for one non-None payload (`codec.encode` or `codec.decode`)."""

Transform = Callable[[Leaf, Any], Any]
"""`transform(leaf, value)`: `value` with `leaf` applied to every payload inside it."""


# The models whose payload fields are plain `JSONValue` annotations (they are shared with the
# JSON forms and the engine, which need no marker): which of those fields are payloads.
PAYLOAD_FIELDS: Mapping[type, frozenset[str]] = {
    WorkflowRun: frozenset({"input", "output"}),
    RunPatch: frozenset({"input", "output"}),
    StepCheckpoint: frozenset({"input", "output"}),
    BufferedSignal: frozenset({"payload"}),
    BufferedEvent: frozenset({"payload"}),
    # A persisted schedule's spec: its `input` is what every run it starts is given. The rest
    # of a schedule record (cadence, counters, the last error) stays readable on purpose,
    # so the console and the CLI list schedules without the key.
    ScheduleSpec: frozenset({"input"}),
}

# JSON fields that stay readable at rest on purpose: a structured error is what the console,
# onError routing and retries read; step events are log lines; a query's origin is a filter
# value (a string, None or the UNSET sentinel).
CLEAR_FIELDS: Mapping[type, frozenset[str]] = {
    StepError: frozenset({"details"}),
    StepEvent: frozenset({"data"}),
    RunQuery: frozenset({"origin"}),
}

# Behaviour, not data: a hold is released, a wake bus carries kinds and run ids.
HANDLES: tuple[type, ...] = (InstanceHold, WakeBus)

_PLAIN: tuple[type, ...] = (
    type(None),
    str,
    int,
    float,
    bool,
    bytes,
    datetime,
    date,
    timedelta,
)


# ------------------------------------------------------------------ transforms


def _payload(leaf: Leaf, value: Any) -> Any:
    return None if value is None else leaf(value)


def _optional(inner: Transform) -> Transform:
    def optional(leaf: Leaf, value: Any) -> Any:
        return None if value is None else inner(leaf, value)

    return optional


def _each_to_list(inner: Transform) -> Transform:
    def each(leaf: Leaf, values: Iterable[Any]) -> list[Any]:
        return [inner(leaf, value) for value in values]

    return each


def _each_to_tuple(inner: Transform) -> Transform:
    def each(leaf: Leaf, values: Iterable[Any]) -> tuple[Any, ...]:
        return tuple([inner(leaf, value) for value in values])

    return each


def _fixed_tuple(parts: tuple[Transform | None, ...]) -> Transform:
    if len(parts) == 2 and parts[0] is None and parts[1] is not None:
        second = parts[1]

        def pair(leaf: Leaf, value: tuple[Any, Any]) -> tuple[Any, Any]:
            return (value[0], second(leaf, value[1]))

        return pair

    def fixed(leaf: Leaf, value: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(value) != len(parts):
            raise ValueError(f"expected a tuple of {len(parts)} items, got {len(value)}")
        return tuple([x if t is None else t(leaf, x) for t, x in zip(parts, value, strict=True)])

    return fixed


def _mapping_values(inner: Transform) -> Transform:
    def values(leaf: Leaf, mapping: Mapping[Any, Any]) -> dict[Any, Any]:
        return {key: inner(leaf, value) for key, value in mapping.items()}

    return values


def _dataclass(fields: tuple[tuple[str, Transform], ...]) -> Transform:
    if all(t is _payload for _, t in fields):
        # The common shape (a run, a checkpoint, a buffered event): payload fields only.
        names = tuple(name for name, _ in fields)

        def payload_fields(leaf: Leaf, obj: Any) -> Any:
            changes: dict[str, Any] | None = None
            for name in names:
                value = getattr(obj, name)
                if value is not None:
                    if changes is None:
                        changes = {}
                    changes[name] = leaf(value)
            return obj if changes is None else replace(obj, **changes)

        return payload_fields

    def nested_fields(leaf: Leaf, obj: Any) -> Any:
        changes: dict[str, Any] = {}
        for name, t in fields:
            value = getattr(obj, name)
            new = t(leaf, value)
            if new is not value:
                changes[name] = new
        return replace(obj, **changes) if changes else obj

    return nested_fields


def _typed_dict(fields: tuple[tuple[str, Transform], ...]) -> Transform:
    def present_keys(leaf: Leaf, mapping: Mapping[str, Any]) -> Any:
        copy: dict[str, Any] | None = None
        for name, t in fields:
            if name in mapping:
                value = mapping[name]
                new = t(leaf, value)
                if new is not value:
                    if copy is None:
                        copy = dict(mapping)
                    copy[name] = new
        return mapping if copy is None else copy

    return present_keys


# ------------------------------------------------------------------ classification

_cache: dict[Any, Transform | None] = {}
_in_progress: set[Any] = set()


def transform_for(tp: Any, where: str = "") -> Transform | None:
    """The transform for values of type `tp` (None: they carry no payload). Raises TypeError
    naming `where` when `tp` cannot be classified. Cached per type."""
    try:
        return _cache[tp]
    except KeyError:
        pass
    except TypeError:  # an unhashable annotation: classify it every time
        return _classify(tp, where or repr(tp))
    found = _classify(tp, where or repr(tp))
    _cache[tp] = found
    return found


def _refuse(where: str, why: str) -> TypeError:
    return TypeError(
        f"durably's data converter cannot classify {where}: {why}. It must know whether a "
        "value carries a payload, or it would write that payload in cleartext "
        "(see durably._store.converter)"
    )


def _classify(tp: Any, where: str) -> Transform | None:
    origin = get_origin(tp)
    if origin is Annotated:
        base, *marks = get_args(tp)
        if any(mark is PAYLOAD for mark in marks):
            if base is not Any:
                raise _refuse(where, f"the payload marker is on {base!r}, not on a JSON value")
            return _payload
        return transform_for(base, where)
    if tp is Any:
        raise _refuse(
            where,
            "an unmarked JSON value (Any): annotate it `Payload` when it is a user payload, "
            "or name the field in CLEAR_FIELDS when it must stay readable",
        )
    if origin is Literal:
        return None
    if origin is Union or origin is types.UnionType:
        return _union(get_args(tp), where)
    if origin is not None:
        return _generic(tp, origin, get_args(tp), where)
    if isinstance(tp, type):
        return _class(tp, where)
    raise _refuse(where, f"{tp!r} is not a type the converter knows")


def _union(members: tuple[Any, ...], where: str) -> Transform | None:
    others = [m for m in members if m is not type(None)]
    carrying = [(m, t) for m in others if (t := transform_for(m, where)) is not None]
    if not carrying:
        return None
    if len(others) > 1:
        # `A | B` with a payload in A: the transform would have to guess which it holds.
        raise _refuse(where, f"a union of {members!r} holds a payload in one of several types")
    return _optional(carrying[0][1])


def _generic(tp: Any, origin: Any, args: tuple[Any, ...], where: str) -> Transform | None:
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = transform_for(args[0], where)
            return None if item is None else _each_to_tuple(item)
        if not args or args == ((),):
            return None
        parts = tuple(transform_for(arg, where) for arg in args)
        return None if all(p is None for p in parts) else _fixed_tuple(parts)
    if origin in (list, Sequence, Iterable):
        (arg,) = args
        item = transform_for(arg, where)
        return None if item is None else _each_to_list(item)
    if origin in (set, frozenset, AbstractSet):
        (arg,) = args
        if transform_for(arg, where) is not None:
            raise _refuse(where, f"a set of payloads ({tp!r})")
        return None
    if origin in (dict, Mapping):
        key, value = args
        if transform_for(key, where) is not None:
            raise _refuse(where, f"a mapping keyed by payloads ({tp!r})")
        item = transform_for(value, where)
        return None if item is None else _mapping_values(item)
    raise _refuse(where, f"the generic type {tp!r}")


def _class(cls: type, where: str) -> Transform | None:
    if cls in _PLAIN or issubclass(cls, Enum) or cls in HANDLES:
        return None
    if cls in (list, tuple, dict, set, frozenset, object):
        raise _refuse(where, f"{cls.__name__} without item types")
    typed_dict = is_typeddict(cls)
    if not (dataclasses.is_dataclass(cls) or typed_dict):
        raise _refuse(
            where,
            f"{cls.__qualname__} is neither a dataclass nor a TypedDict (add it to HANDLES "
            "if it is behaviour that carries no payload)",
        )
    if cls in _in_progress:
        raise _refuse(where, f"{cls.__qualname__} refers to itself")
    _in_progress.add(cls)
    try:
        hints = get_type_hints(cls, include_extras=True)
        if dataclasses.is_dataclass(cls):
            names = [f.name for f in dataclasses.fields(cls)]
        else:
            names = list(hints)
        payloads = PAYLOAD_FIELDS.get(cls, frozenset())
        clear = CLEAR_FIELDS.get(cls, frozenset())
        fields: list[tuple[str, Transform]] = []
        for name in names:
            if name in payloads:
                fields.append((name, _payload))
            elif name not in clear:
                found = transform_for(hints[name], f"{where} → {cls.__qualname__}.{name}")
                if found is not None:
                    fields.append((name, found))
    finally:
        _in_progress.discard(cls)
    if not fields:
        return None
    return _typed_dict(tuple(fields)) if typed_dict else _dataclass(tuple(fields))


# ------------------------------------------------------------------ the converter


def _same(value: JSONValue) -> JSONValue:
    return value


class DataConverter:
    """Payloads ↔ their form at rest, by type: `encode(value, tp)` before a store writes,
    `decode(value, tp)` after it reads. Without a codec both are the identity."""

    __slots__ = ("codec", "decode_json", "encode_json")

    def __init__(self, codec: Codec | None = None) -> None:
        self.codec = codec
        # The codec's own bound methods: what the transforms call for each non-None payload.
        self.encode_json: Leaf = _same if codec is None else codec.encode
        self.decode_json: Leaf = _same if codec is None else codec.decode

    def encode_payload(self, value: JSONValue) -> JSONValue:
        return None if value is None else self.encode_json(value)

    def decode_payload(self, value: JSONValue) -> JSONValue:
        return None if value is None else self.decode_json(value)

    def encode(self, value: _T, tp: Any) -> _T:
        transform = transform_for(tp)
        return value if transform is None else cast(_T, transform(self.encode_json, value))

    def decode(self, value: _T, tp: Any) -> _T:
        transform = transform_for(tp)
        return value if transform is None else cast(_T, transform(self.decode_json, value))

    def __repr__(self) -> str:
        return f"DataConverter({self.codec!r})"
