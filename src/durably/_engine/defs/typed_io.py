"""Typed inputs and outputs of steps and workflows.

A parameter or return annotated with a pydantic model, a dataclass, a TypedDict (or any type
pydantic can validate) gets a `TypeAdapter`: values are validated on the way in, the store
keeps their JSON form, and the body receives the typed value rebuilt from that JSON. The hot
path and the replay path therefore hand the body the same thing (a value rebuilt from JSON),
which keeps bodies deterministic across a crash.

Unannotated values must already be JSON; they are normalised through a JSON round trip
(tuples become lists) for the same reason.
"""

from __future__ import annotations

import inspect
import json
import math
import typing
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import TypeAdapter, ValidationError

from durably._core.errors import SerializationError

_PLAIN = (inspect.Parameter.empty, Any, object, None)


class ValueCodec:
    """Turns a user value into stored JSON and stored JSON back into the user value."""

    __slots__ = ("_adapter", "annotation")

    def __init__(self, annotation: Any = None):
        self.annotation = annotation
        self._adapter: TypeAdapter[Any] | None = None
        if annotation not in _PLAIN and annotation is not type(None):
            try:
                self._adapter = TypeAdapter(annotation)
            except Exception:  # pydantic cannot build a schema: treat the value as plain JSON
                self._adapter = None

    @property
    def typed(self) -> bool:
        return self._adapter is not None

    def validate(self, value: Any) -> Any:
        """Validate a user value; raises `pydantic.ValidationError`."""
        if self._adapter is None:
            return value
        return self._adapter.validate_python(value)

    def to_json(self, value: Any) -> Any:
        """User value → JSON-compatible value. Raises SerializationError."""
        if self._adapter is not None:
            try:
                value = self._adapter.dump_python(value, mode="json")
            except Exception as exc:
                raise SerializationError(
                    f"value of type {type(value).__name__} cannot be serialized as "
                    f"{self.annotation!r}: {exc}"
                ) from exc
        # Hot path (one call per step input and output): a plain scalar is already its own
        # JSON form, so the round trip below would only cost two C calls and two objects.
        kind = type(value)
        if kind is int or kind is str or kind is bool or value is None:
            return value
        if kind is float and math.isfinite(value):
            return value
        try:
            return json.loads(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise SerializationError(
                f"value of type {type(value).__name__} is not JSON-serializable: {exc}"
            ) from exc

    def from_json(self, value: Any) -> Any:
        """Stored JSON → the value the body receives."""
        if self._adapter is None:
            return value
        return self._adapter.validate_python(value)


PLAIN = ValueCodec(None)


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=False)
    except Exception:
        return {}


def codecs_for(fn: Callable[..., Any], *, skip_first: bool) -> tuple[ValueCodec, ValueCodec, int]:
    """Codecs for the (single) input parameter and the return value of `fn`.

    Returns (input codec, output codec, number of input parameters taken: 0 or 1).
    `skip_first` skips the workflow's `ctx` parameter.
    """
    hints = _hints(fn)
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if skip_first and params:
        params = params[1:]
    arity = 1 if params else 0
    in_codec = ValueCodec(hints.get(params[0].name)) if params else PLAIN
    ret = hints.get("return")
    origin = typing.get_origin(ret)
    if origin is not None and getattr(origin, "__name__", "") in ("Coroutine", "Awaitable"):
        ret = typing.get_args(ret)[-1]
    out_codec = ValueCodec(ret)
    return in_codec, out_codec, arity


def validation_details(exc: ValidationError) -> list[dict[str, Any]]:
    return [
        {
            "loc": [str(p) for p in err.get("loc", ())],
            "msg": err.get("msg"),
            "type": err.get("type"),
        }
        for err in exc.errors()
    ]


# ------------------------------------------------------------------ several arguments

ARGS_KEY = "$durably.args"
KWARGS_KEY = "$durably.kwargs"
"""The two keys of the stored form of a step call with several (or keyword) arguments:
`{"$durably.args": [...], "$durably.kwargs": {...}}`, each argument in its own parameter's JSON
form. A call with one positional argument stores that argument's JSON alone, as before steps
took arguments; a single input whose JSON object carries either key is refused, so the two
forms can never be mistaken for each other."""


class Args:
    """The arguments of one step call, for `ctx.all` / `ctx.all_settled` items (and usable
    as the single argument of `ctx.step`): `durably.Args(order, rate, currency="EUR")` calls
    the step as `step(order, rate, currency="EUR")`. Any other item, a tuple included, is the
    step's one input, as it always was."""

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args: tuple[Any, ...] = args
        self.kwargs: dict[str, Any] = kwargs

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"durably.Args({', '.join(parts)})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Args):
            return NotImplemented
        return self.args == other.args and self.kwargs == other.kwargs

    __hash__ = None  # type: ignore[assignment]  # holds unhashable values; equality only


def is_args_envelope(value: Any) -> bool:
    """Whether a stored step input is the several-arguments form (see `ARGS_KEY`)."""
    return (
        type(value) is dict
        and len(value) == 2
        and isinstance(value.get(ARGS_KEY), list)
        and isinstance(value.get(KWARGS_KEY), dict)
    )


def refuse_reserved_keys(json_value: Any, what: str) -> None:
    """A single input whose JSON object holds a key of the several-arguments form would be
    read back as arguments: refused (`ValueError`) rather than stored ambiguously."""
    if type(json_value) is dict and (ARGS_KEY in json_value or KWARGS_KEY in json_value):
        raise ValueError(
            f"{what}: a single step input may not be an object with the key {ARGS_KEY!r} or "
            f"{KWARGS_KEY!r} (reserved for calls with several arguments); pass it inside "
            "another object, or as durably.Args(value)"
        )


def signature_of(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a callable without one: nothing is checked
        return None


def refuse_unbindable(
    signature: inspect.Signature | None, call: Args, what: str, reserved: Iterable[str] = ()
) -> None:
    """A TypeError (`what: reason`) when a function of `signature` cannot take `call`.
    `reserved`: keywords the caller keeps for itself (ctx.step's options); a parameter named
    like one is named in the message, since it can only be passed positionally."""
    if signature is None:
        return
    try:
        signature.bind(*call.args, **call.kwargs)
    except TypeError as exc:
        taken = set(reserved)
        clash = [n for n in signature.parameters if n in taken]
        hint = (
            f" ({', '.join(repr(n) for n in clash)}: a ctx.step option keyword, so that "
            "parameter is passed positionally)"
            if clash
            else ""
        )
        raise TypeError(f"{what}: {exc}{hint}") from None


class ArgCodecs:
    """The codec of each parameter of a step function, to store a call's arguments and to
    rebuild them for the function (each validated like a single input is)."""

    __slots__ = (
        "_by_name",
        "_names",
        "_positional",
        "_signature",
        "_var_keyword",
        "_var_positional",
    )

    def __init__(self, fn: Callable[..., Any] | None):
        self._signature: inspect.Signature | None = None
        self._positional: list[ValueCodec] = []
        self._names: list[str] = []  # of the positional parameters, for error messages
        self._by_name: dict[str, ValueCodec] = {}
        self._var_positional = PLAIN
        self._var_keyword = PLAIN
        if fn is None:  # a step known only by name: its arguments must already be JSON
            return
        self._signature = signature_of(fn)
        if self._signature is None:
            return
        hints = _hints(fn)
        for p in self._signature.parameters.values():
            codec = ValueCodec(hints.get(p.name))
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                self._positional.append(codec)
                self._names.append(p.name)
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                self._by_name[p.name] = codec
            if p.kind == p.VAR_POSITIONAL:
                self._var_positional = codec
            if p.kind == p.VAR_KEYWORD:
                self._var_keyword = codec

    def check(self, call: Args, what: str, reserved: Iterable[str] = ()) -> None:
        """A TypeError naming the step when the function cannot take these arguments."""
        refuse_unbindable(self._signature, call, what, reserved)

    def _at(self, index: int) -> ValueCodec:
        return self._positional[index] if index < len(self._positional) else self._var_positional

    def _named(self, name: str) -> ValueCodec:
        return self._by_name.get(name, self._var_keyword)

    def to_json(self, call: Args) -> dict[str, Any]:
        """The stored form of a call: `{"$durably.args": [...], "$durably.kwargs": {...}}`."""
        return {
            ARGS_KEY: [self._at(i).to_json(v) for i, v in enumerate(call.args)],
            KWARGS_KEY: {str(k): self._named(k).to_json(v) for k, v in call.kwargs.items()},
        }

    def from_json(self, stored: dict[str, Any]) -> Args:
        """The stored form → the arguments the function receives, each validated by its
        parameter's codec (`ArgumentValidationError` names the parameter that failed)."""
        args = [
            _decoded(self._at(i), v, self._names[i] if i < len(self._names) else f"#{i}")
            for i, v in enumerate(stored[ARGS_KEY])
        ]
        kwargs = {k: _decoded(self._named(k), v, k) for k, v in stored[KWARGS_KEY].items()}
        return Args(*args, **kwargs)


class ArgumentValidationError(ValueError):
    """An argument of a step call failed its parameter's validation."""

    def __init__(self, parameter: str, error: ValidationError):
        super().__init__(f"argument {parameter!r}: {error}")
        self.parameter = parameter
        self.error = error


def _decoded(codec: ValueCodec, value: Any, parameter: str) -> Any:
    try:
        return codec.from_json(value)
    except ValidationError as exc:
        raise ArgumentValidationError(parameter, exc) from exc


PLAIN_ARGS = ArgCodecs(None)


def output_type_codec(output_type: Any) -> ValueCodec:
    """The codec of a start's `output_type=` (the output type of a run started by name):
    `TypeError` naming the type when pydantic cannot validate it, instead of the plain-JSON
    fallback a workflow's annotation gets — a type given on purpose must be honoured."""
    if output_type in _PLAIN:
        return ValueCodec(None)
    try:
        TypeAdapter(output_type)
    except Exception as exc:
        raise TypeError(f"output_type={output_type!r} cannot be validated: {exc}") from None
    return ValueCodec(output_type)
