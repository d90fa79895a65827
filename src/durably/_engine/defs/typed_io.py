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
from collections.abc import Callable
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
