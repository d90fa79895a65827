"""The payload codec wrapper: `CodecStateStore(inner, codec)`.

A `Codec` turns a JSON payload into another JSON value at rest and back (`encode`/`decode`,
synchronous, exact inverses; `None` is never passed to it and stays `None`). The wrapper
implements the whole `StateStore` contract over any complete store, encoding every payload
written and decoding every payload read: run `input`/`output`, checkpoint `input`/`output`
(bulk forms and fan placeholders included), buffered signal and event payloads, and the
payloads of `deliver_signals`. Everything else passes through untouched: ids, statuses, names,
tags, search attributes, namespace, origin, timestamps, `error` (a structured error stays
readable), checkpoint `events`, waiter rows, and every aggregate (counts, facets,
`checkpoint_stats`), which read no payload.

Its methods are not written by hand: they are DERIVED, once, when this module is imported,
from the annotations of the `StateStore` protocol (`derive_codec_methods`). For each contract
method the `DataConverter` (`converter.py`) classifies every parameter's and the return
value's annotation; the wrapper encodes the parameters whose type carries a payload and
decodes the result by its type, and a method whose types carry none is a plain forward. So a
new store method needs nothing here: its annotations say where its payloads are (a model the
converter knows, or `Payload` for a bare JSON value). A method whose annotations the converter
cannot classify (an unmarked `JSONValue`, an unknown class) fails the import of durably, with
a `TypeError` naming the method and the parameter, rather than write a payload in cleartext.
Each wrapper is generated as source with the protocol method's own signature (as
`durably._core.jsonshape` generates its converters): a call runs the same few lines a
hand-written forward would, with nothing looked up per call.

Methods outside the contract are NOT forwarded — a payload-carrying method the wrapper
cannot encode must fail rather than write cleartext — while plain data attributes (test
hooks such as `statement_count`) are readable through the wrapper.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, get_type_hints

from durably._store.converter import Codec, CodecError, DataConverter, Transform, transform_for
from durably._store.protocol import StateStore, require_store

__all__ = [
    "Codec",
    "CodecError",
    "CodecStateStore",
    "DataConverter",
    "contract_methods",
    "derive_codec_methods",
    "plan_method",
    "wrap_store",
]


def contract_methods(contract: type) -> dict[str, Callable[..., Any]]:
    """The public methods a protocol declares, its own and its parent protocols' (a union
    of roles: `StateStore`), in method resolution order and declaration order within each
    (the subclass's definition wins)."""
    found: dict[str, Callable[..., Any]] = {}
    for klass in contract.__mro__:
        if klass is Protocol or not klass.__dict__.get("_is_protocol", False):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and inspect.isfunction(value):
                found.setdefault(name, value)
    return found


def plan_method(
    contract: type, name: str, fn: Callable[..., Any]
) -> tuple[dict[str, Transform], Transform | None]:
    """Which parameters of `fn` carry payloads (name → transform) and how its result is
    decoded (None: as is). TypeError when an annotation cannot be classified."""
    where = f"{contract.__name__}.{name}"
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise TypeError(f"{where}: its annotations cannot be resolved ({exc})") from exc
    encoded: dict[str, Transform] = {}
    for param in list(inspect.signature(fn).parameters.values())[1:]:  # without self
        if param.name not in hints:
            raise TypeError(f"{where}: parameter {param.name!r} has no annotation")
        if param.name.startswith(_PREFIX):
            raise TypeError(f"{where}: parameter names starting {_PREFIX!r} are reserved")
        transform = transform_for(hints[param.name], f"{where} parameter {param.name!r}")
        if transform is None:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{where}: payloads in *{param.name} cannot be planned")
        encoded[param.name] = transform
    if "return" not in hints:
        raise TypeError(f"{where}: the return value has no annotation")
    return encoded, transform_for(hints["return"], f"{where} return value")


_PREFIX = "_dur_"  # the generated code's own names, apart from any parameter's


def _method(
    owner: str,
    name: str,
    fn: Callable[..., Any],
    encoded: dict[str, Transform],
    result: Transform | None,
) -> Callable[..., Any]:
    """The wrapper of one contract method, generated as source with the protocol's own
    signature: the same code a hand-written forward would be (no *args packing, no lookup of
    what to encode), so a call costs what the hand-written wrapper cost."""
    params = list(inspect.signature(fn).parameters.values())
    self_name = params[0].name
    ns: dict[str, Any] = {}
    header: list[str] = [self_name]
    call: list[str] = []
    star_done = False
    for i, param in enumerate(params[1:], start=1):
        text = param.name
        if param.default is not param.empty:
            ns[f"{_PREFIX}d_{param.name}"] = param.default
            text += f"={_PREFIX}d_{param.name}"
        value = param.name
        if param.name in encoded:
            ns[f"{_PREFIX}t_{param.name}"] = encoded[param.name]
            value = f"{_PREFIX}t_{param.name}({self_name}._encode_json, {param.name})"
        if param.kind is param.VAR_POSITIONAL:
            header.append(f"*{param.name}")
            call.append(f"*{param.name}")
            star_done = True
        elif param.kind is param.VAR_KEYWORD:
            header.append(f"**{param.name}")
            call.append(f"**{param.name}")
        elif param.kind is param.KEYWORD_ONLY:
            if not star_done:
                header.append("*")
                star_done = True
            header.append(text)
            call.append(f"{param.name}={value}")
        else:
            header.append(text)
            call.append(value)
            more_positional_only = (
                i + 1 < len(params) and params[i + 1].kind is param.POSITIONAL_ONLY
            )
            if param.kind is param.POSITIONAL_ONLY and not more_positional_only:
                header.append("/")
    is_async = inspect.iscoroutinefunction(fn)
    inner = f"{self_name}._inner.{name}({', '.join(call)})"
    if is_async:
        inner = f"await {inner}"
    if result is not None:
        ns[f"{_PREFIX}result"] = result
        inner = f"{_PREFIX}result({self_name}._decode_json, {inner})"
    source = f"{'async ' if is_async else ''}def {name}({', '.join(header)}):\n    return {inner}\n"
    exec(compile(source, f"<durably codec {owner}.{name}>", "exec"), ns)
    method: Callable[..., Any] = ns[name]
    method.__qualname__ = f"{owner}.{name}"
    method.__annotations__ = dict(fn.__annotations__)
    method.__doc__ = (
        f"`{name}` on the inner store; payloads encoded in: "
        f"{', '.join(encoded) or 'nothing'}; result {'as is' if result is None else 'decoded'}."
    )
    return method


def derive_codec_methods(contract: type, owner: str = "CodecStateStore") -> type:
    """A class with one wrapper per method of the protocol `contract` (see the module doc).

    The wrappers read `self._inner` (the store), `self._encode_json` / `self._decode_json`
    (the codec's two directions). Raises TypeError when an annotation cannot be classified."""
    namespace: dict[str, Any] = {}
    for name, fn in contract_methods(contract).items():
        encoded, result = plan_method(contract, name, fn)
        namespace[name] = _method(owner, name, fn, encoded, result)
    namespace["_contract_methods"] = tuple(namespace)
    return type(f"{contract.__name__}CodecMethods", (), namespace)


if TYPE_CHECKING:
    # For the type checker the methods come from `StateStore` (the second base), with their
    # declared signatures; at run time the derived class, earlier in the MRO, provides them.
    _StateStoreCodecMethods: Any = object
else:
    _StateStoreCodecMethods = derive_codec_methods(StateStore)


class CodecStateStore(_StateStoreCodecMethods, StateStore):  # type: ignore[misc]
    """Any complete `StateStore` (`inner`) with its payloads encoded by `codec` at rest."""

    _contract_methods: tuple[str, ...]

    def __init__(self, inner: Any, codec: Codec):
        self._inner: StateStore = require_store(inner)
        lacking = [n for n in self._contract_methods if not callable(getattr(inner, n, None))]
        if lacking:  # a subclass derived from a wider contract than StateStore
            raise TypeError(f"{type(inner).__name__} lacks {', '.join(lacking)}")
        self._converter = DataConverter(codec)
        self._encode_json = self._converter.encode_json
        self._decode_json = self._converter.decode_json

    @property
    def inner(self) -> StateStore:
        """The wrapped store, where the rows are (reads through it return the encoded
        values). Whatever runs on the store's own backend rather than through the contract
        (the fleet-wide admission of a PostgreSQL store) is built on it."""
        return self._inner

    @property
    def codec(self) -> Codec:
        codec = self._converter.codec
        assert codec is not None
        return codec

    @property
    def converter(self) -> DataConverter:
        return self._converter

    def __getattr__(self, name: str) -> Any:
        # Plain data attributes of the inner store (test hooks, counters) read through;
        # methods never do (see the module docstring).
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._inner, name)
        if callable(value):
            raise AttributeError(
                f"{type(self).__name__} does not forward {name!r}: it cannot tell whether "
                "the method carries payloads"
            )
        return value

    def __repr__(self) -> str:
        return f"CodecStateStore({self._inner!r}, {self.codec!r})"


def wrap_store(store: Any, codec: Codec | None) -> Any:
    """`Engine(codec=...)`: the store wrapped in a `CodecStateStore` (unchanged for None)."""
    if codec is None:
        return store
    if not isinstance(codec, Codec):
        raise TypeError("codec must have encode(value) and decode(value) methods")
    return CodecStateStore(store, codec)
