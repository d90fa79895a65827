"""One converter for every data object: snake_case attributes ↔ camelCase JSON.

Data objects are immutable slotted dataclasses. Deriving from `JsonObject` gives a class
`to_json()` and `from_json()`, generated from its fields the first time either is called and
then installed on the class, so later calls run a plain function written for that class
(attribute reads and dict stores, no per-field loop). Construction stays plain dataclass speed:
the base adds no fields, no `__init__` and no per-instance state.

The rules, one place for all objects:

- Keys: each field's name in camelCase (`run_id` → `runId`); `json_field(key=...)` overrides.
- Order: the field order, or the class's `order=` (the order is part of the bytes: the run
  detail's ETag and the console read them).
- Absent values: `None` is never written (the key is omitted, not `null`);
  `json_field(write="truthy")` also omits empty/false values (and reads them back as absent),
  `write="always"` writes `null` for a documented nullable key.
- Dates: `dates="iso"` writes full precision (`2026-03-04T05:06:07.891234Z`, the persisted
  and engine-event form); `dates="iso_ms"` writes JavaScript's `toISOString` form
  (`2026-03-04T05:06:07.891Z`, the read side). Reading accepts either, any ISO-8601 offset,
  epoch milliseconds and datetimes.
- Nested data objects, tuples of them, tuples of strings and mappings are converted by type.
- Reading is lenient the way a JSON reader of stored rows must be: a missing or `null` key
  takes the field's default (or `json_field(read_default=...)`); a value of the wrong JSON type
  in an optional str/int/bool field reads as absent; required strings and ints are coerced
  (`str(...)`, `int(...)`); an optional `Literal` reads a value outside its choices as absent.
  A missing required key, or a value that cannot be coerced, raises
  `ValueError` naming the class and the key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, Self

__all__ = [
    "DateStyle",
    "JsonObject",
    "Write",
    "iso_ms",
    "iso_utc",
    "json_field",
    "parse_datetime",
]

DateStyle = Literal["iso", "iso_ms"]
Write = Literal["present", "truthy", "always"]

_META_KEY = "durably.json"


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


_NO_DEFAULT: Any = _NoDefault()


def iso_utc(value: datetime) -> str:
    """UTC ISO-8601 at full precision with a `Z` (naive datetimes are taken as UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def iso_ms(value: datetime) -> str:
    """JavaScript's `Date.prototype.toISOString`: UTC, millisecond precision, `Z`.
    A naive datetime is taken as UTC (the engine only writes aware ones)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    value = value.astimezone(UTC)
    return f"{value:%Y-%m-%dT%H:%M:%S}.{value.microsecond // 1000:03d}Z"


def parse_datetime(value: Any) -> datetime | None:
    """Read a date written by either form above, any ISO-8601 offset, epoch milliseconds or a
    datetime. Naive values are taken as UTC; None stays None."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value / 1000.0, tz=UTC)
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


_DATE_WRITERS: dict[str, Callable[[datetime], str]] = {"iso": iso_utc, "iso_ms": iso_ms}


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldOptions:
    key: str | None = None
    write: Write = "present"
    read_default: Any = _NO_DEFAULT
    read_fallback: Callable[[Mapping[str, Any]], Any] | None = None
    write_fallback: Callable[[Any], Any] | None = None
    encode: Callable[[Any], Any] | None = None
    decode: Callable[[Any], Any] | None = None


def json_field(
    *,
    key: str | None = None,
    write: Write = "present",
    read_default: Any = _NO_DEFAULT,
    read_fallback: Callable[[Mapping[str, Any]], Any] | None = None,
    write_fallback: Callable[[Any], Any] | None = None,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """Per-field JSON options, passed as `dataclasses.field(metadata=json_field(...))`.

    - `key`: the JSON key when it is not the camelCase of the name;
    - `write`: "present" (default: omitted when None), "truthy" (omitted when empty or false,
      and an empty or false value read back counts as absent), "always" (`null` written);
    - `read_default`: the value of a missing or null key when it is not the field's default;
    - `read_fallback`: called with the other decoded fields when the read value is empty
      (None or ""), e.g. a step id derived from the run id and seq;
    - `write_fallback`: called with the object when the field is None, to write a value
      derived from other fields;
    - `encode` / `decode`: a custom conversion of the value (used instead of the type's).
    """
    return {
        _META_KEY: _FieldOptions(
            key=key,
            write=write,
            read_default=read_default,
            read_fallback=read_fallback,
            write_fallback=write_fallback,
            encode=encode,
            decode=decode,
        )
    }


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class JsonObject:
    """Base of the data objects: `to_json()` / `from_json()` derived from the fields.

    Options per class, as class keywords: `dates` ("iso" or "iso_ms", see the module
    docstring) and `order` (field names in the order their keys are written)."""

    __slots__ = ()
    _json_dates: DateStyle = "iso"
    _json_order: tuple[str, ...] | None = None

    def __init_subclass__(
        cls, *, dates: DateStyle | None = None, order: tuple[str, ...] | None = None
    ) -> None:
        super().__init_subclass__()
        # `@dataclass(slots=True)` builds the class a second time, without these keywords:
        # the first build's values are already copied into the class dict, so only set what
        # was given.
        if dates is not None:
            cls._json_dates = dates
        if order is not None:
            cls._json_order = order
        # A subclass of a class whose converters are installed gets its own, built lazily.
        if "to_json" not in cls.__dict__:
            type.__setattr__(cls, "to_json", JsonObject.to_json)
        if "from_json" not in cls.__dict__:
            type.__setattr__(cls, "from_json", JsonObject.__dict__["from_json"])

    def to_json(self) -> dict[str, Any]:
        _install(type(self))
        return type(self).to_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        _install(cls)
        return cls.from_json(data)


# ---------------------------------------------------------------- generation


def _strip_none(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None was allowed)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        nullable = len(args) != len(typing.get_args(tp))
        inner: Any = args[0] if len(args) == 1 else typing.Union[tuple(args)]  # noqa: UP007
        return inner, nullable
    return tp, tp is Any


def _is_json_object(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, JsonObject)


def _is_mapping(tp: Any) -> bool:
    origin = typing.get_origin(tp) or tp
    return isinstance(origin, type) and issubclass(origin, Mapping)


def _tuple_item(tp: Any) -> Any | None:
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
    return None


class _Gen:
    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        self.ns: dict[str, Any] = {
            "Mapping": Mapping,
            "_num": _as_int,
            "_parse": parse_datetime,
            "_bad": _bad_value,
        }
        self._n = 0

    def const(self, value: Any) -> str:
        self._n += 1
        name = f"_c{self._n}"
        self.ns[name] = value
        return name


def _as_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _bad_value(cls_name: str, key: str, exc: Exception) -> ValueError:
    return ValueError(f"{cls_name} JSON: key {key!r} has an unusable value ({exc})")


def _missing_key(cls_name: str, key: str) -> ValueError:
    return ValueError(f"{cls_name} JSON: required key {key!r} is missing")


def _fields_in_order(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    order: tuple[str, ...] | None = getattr(cls, "_json_order", None)
    if order is None:
        return list(fields.values())
    if sorted(order) != sorted(fields):
        raise TypeError(f"{cls.__name__}: order= must list every field once, got {order!r}")
    return [fields[name] for name in order]


def _install(cls: type[JsonObject]) -> None:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} derives from JsonObject but is not a dataclass")
    hints = typing.get_type_hints(cls)
    dates: DateStyle = getattr(cls, "_json_dates", "iso")
    gen = _Gen(cls)
    write_date = gen.const(_DATE_WRITERS[dates])
    enc_lines = ["def to_json(self):", "    out = {}"]
    dec_lines = ["def from_json(cls, data):", "    get = data.get"]
    fallbacks: list[tuple[str, str]] = []
    ctor_args: list[str] = []
    for f in _fields_in_order(cls):
        opts: _FieldOptions = f.metadata.get(_META_KEY, _FieldOptions())
        key = opts.key or camel(f.name)
        tp, nullable = _strip_none(hints[f.name])
        var = f"f_{f.name}"
        # -- write
        enc_lines.append(f"    v = self.{f.name}")
        if opts.write_fallback is not None:
            enc_lines.append(f"    if v is None: v = {gen.const(opts.write_fallback)}(self)")
        value = _encode_expr(gen, tp, opts, write_date)
        if opts.write == "always":
            enc_lines.append(f"    out[{key!r}] = None if v is None else {value}")
        else:
            test = "v" if opts.write == "truthy" else "v is not None"
            enc_lines.append(f"    if {test}: out[{key!r}] = {value}")
        # -- read: a missing, null (or, for "truthy" fields, empty) key and a value of the
        # wrong JSON type both read as absent, which is the default.
        absent = "v is None" if opts.write != "truthy" else "not v"
        read, may_fail = _decode_expr(gen, tp, nullable, opts)
        dec_lines.append(f"    v = get({key!r})")
        if may_fail:
            dec_lines += [
                "    try:",
                f"        {var} = None if {absent} else {read}",
                "    except (TypeError, ValueError, KeyError) as exc:",
                f"        raise _bad(cls.__name__, {key!r}, exc) from exc",
            ]
        else:
            dec_lines.append(f"    {var} = None if {absent} else {read}")
        default = _default_expr(gen, f, opts, nullable, key)
        if default != "None":
            dec_lines.append(f"    if {var} is None: {var} = {default}")
        if opts.read_fallback is not None:
            fallbacks.append((f.name, gen.const(opts.read_fallback)))
        ctor_args.append(f"{f.name}={var}")
    for name, fb in fallbacks:
        decoded = ", ".join(f"{f.name!r}: f_{f.name}" for f in dataclasses.fields(cls))
        dec_lines.append(f"    if f_{name} is None or f_{name} == '':")
        dec_lines.append(f"        f_{name} = {fb}({{{decoded}}})")
    enc_lines.append("    return out")
    dec_lines.append(f"    return cls({', '.join(ctor_args)})")
    source = "\n".join(enc_lines) + "\n\n" + "\n".join(dec_lines) + "\n"
    exec(compile(source, f"<jsonshape {cls.__qualname__}>", "exec"), gen.ns)
    to_json = gen.ns["to_json"]
    from_json = gen.ns["from_json"]
    to_json.__qualname__ = f"{cls.__qualname__}.to_json"
    from_json.__qualname__ = f"{cls.__qualname__}.from_json"
    # A class that writes one direction by hand keeps it.
    if cls.__dict__.get("to_json") is JsonObject.to_json:
        type.__setattr__(cls, "to_json", to_json)
    if cls.__dict__.get("from_json") is JsonObject.__dict__["from_json"]:
        type.__setattr__(cls, "from_json", classmethod(from_json))


def _encode_expr(gen: _Gen, tp: Any, opts: _FieldOptions, write_date: str) -> str:
    if opts.encode is not None:
        return f"{gen.const(opts.encode)}(v)"
    if tp is datetime:
        return f"{write_date}(v)"
    if _is_json_object(tp):
        return "v.to_json()"
    item = _tuple_item(tp)
    if item is not None:
        return "[e.to_json() for e in v]" if _is_json_object(item) else "list(v)"
    if _is_mapping(tp):
        return "dict(v)"
    return "v"


def _default_expr(
    gen: _Gen, f: dataclasses.Field[Any], opts: _FieldOptions, nullable: bool, key: str
) -> str:
    if opts.read_default is not _NO_DEFAULT:
        return gen.const(opts.read_default)
    if f.default is not dataclasses.MISSING:
        return gen.const(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return f"{gen.const(f.default_factory)}()"
    if nullable or opts.read_fallback is not None:
        return "None"
    return _raise_missing(gen, key)


def _raise_missing(gen: _Gen, key: str) -> str:
    # An expression that raises: the default of a required key.
    def missing(cls_name: str) -> Any:
        raise _missing_key(cls_name, key)

    return f"{gen.const(missing)}(cls.__name__)"


def _decode_expr(gen: _Gen, tp: Any, nullable: bool, opts: _FieldOptions) -> tuple[str, bool]:
    """(expression reading `v` — present — into the field's value or None for absent,
    whether it may raise)."""
    if opts.decode is not None:
        return f"{gen.const(opts.decode)}(v)", True
    if tp is datetime:
        return "_parse(v)", True
    if tp is str:
        return ("v if v.__class__ is str else None", False) if nullable else ("str(v)", False)
    if tp is int:
        return ("_num(v)", False) if nullable else ("int(v)", True)
    if tp is bool:
        return ("v if v.__class__ is bool else None", False) if nullable else ("v is True", False)
    if nullable and typing.get_origin(tp) is Literal:
        # An optional choice reads a value outside its choices as absent; a required one is
        # kept as given (a newer writer's status must not make a whole row unreadable).
        return f"v if v in {gen.const(tuple(typing.get_args(tp)))} else None", False
    if _is_json_object(tp):
        return f"{gen.const(tp)}.from_json(v) if isinstance(v, Mapping) else None", True
    item = _tuple_item(tp)
    if item is not None:
        if _is_json_object(item):
            conv = f"{gen.const(item)}.from_json(e)"
        elif item is str:
            conv = "str(e)"
        else:
            conv = "e"
        return f"tuple({conv} for e in v) if isinstance(v, list | tuple) else None", True
    if _is_mapping(tp):
        args = typing.get_args(tp)
        value_type = args[1] if len(args) == 2 else Any
        if value_type is int:
            return (
                "{str(k): int(x) for k, x in v.items()} if isinstance(v, Mapping) else None",
                True,
            )
        return "dict(v) if isinstance(v, Mapping) else None", False
    return "v", False
