"""`CodecStateStore`'s methods are derived from the `StateStore` annotations.

1. The derived plan for the contract: which parameters are encoded and which results decoded,
   equal to what the hand-written wrapper did method by method.
2. A method added to a contract is covered without touching the codec: parameters and results
   of every payload-carrying shape (models, `Payload`, sequences, tuples, optionals, mappings,
   a new dataclass with a `Payload` field) are encoded in the inner store and decoded back.
3. An annotation the converter cannot classify is refused with a TypeError naming the method
   and the parameter — at the import of durably when it is in `StateStore` itself.
4. `DataConverter` on its own: None never reaches the codec, a value without payloads is
   returned as is, keyword and default arguments are encoded too.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pytest

from durably import (
    CodecStateStore,
    InMemoryStateStore,
    SignalWaiter,
    StateStore,
    StepCheckpoint,
    WorkflowRun,
)
from durably._core.models import BufferedEvent, BufferedSignal, ChildWait, JSONValue, RunPatch
from durably._store.codec import (
    DataConverter,
    contract_methods,
    derive_codec_methods,
    plan_method,
)
from durably._store.protocol import (
    METHOD_ROLES,
    STORE_METHODS,
    STORE_ROLES,
    Payload,
)
from tests.store.support import make_cp, make_run


class TagCodec:
    """Visible and reversible; refuses None and anything it did not encode."""

    def encode(self, value: Any) -> Any:
        assert value is not None, "None must never reach the codec"
        return {"enc": json.dumps(value)}

    def decode(self, value: Any) -> Any:
        assert isinstance(value, dict) and set(value) == {"enc"}, f"not encoded: {value!r}"
        return json.loads(value["enc"])


def enc(value: Any) -> Any:
    return {"enc": json.dumps(value)}


# ---------------------------------------------------------------- 1. the contract's plan

# What the hand-written wrapper encoded (parameters) and decoded (results), method by method.
HAND_WRITTEN_ENCODED = {
    "create_run": ["run"],
    "create_runs": ["runs"],
    "update_run": ["patch"],
    "update_run_if_status": ["patch"],
    "save_checkpoint": ["cp"],
    "save_checkpoint_if_pending": ["cp"],
    "save_checkpoints_if_pending": ["cps"],
    "save_checkpoints": ["cps"],
    "fold_checkpoints": ["cp"],
    "register_child_waits": ["waits"],
    "deliver_signals": ["payloads"],
    "buffer_signal": ["payload"],
    "buffer_signal_bounded": ["payload"],
    "buffer_event": ["event"],
}
HAND_WRITTEN_DECODED = {
    "get_run",
    "get_checkpoint",
    "list_checkpoints",
    "get_latest_checkpoint_by_name",
    "list_checkpoints_by_name_prefix",
    "query_checkpoints",
    "deliver_signals",
    "list_incomplete_runs",
    "list_due_timers",
    "list_orphaned_suspended",
    "claim_run",
    "claim_runs",
    "claim_pending_runs",
    "list_buffered_events",
    "list_runs",
}
HAND_WRITTEN_METHODS = (
    "ensure_schema close create_run create_runs update_run update_run_if_status get_run "
    "delete_run get_checkpoint save_checkpoint save_checkpoint_if_pending "
    "save_checkpoints_if_pending save_checkpoints list_checkpoints get_latest_checkpoint_by_name "
    "list_checkpoints_by_name_prefix count_checkpoints fold_checkpoints checkpoint_stats "
    "query_checkpoints list_incomplete_runs list_due_timers "
    "list_orphaned_suspended release_run_lock renew_run_locks "
    "release_locks_of claim_run claim_runs claim_pending_runs hold_instance wake_bus "
    "put_signal_waiter list_signal_waiters remove_signal_waiter "
    "register_child_waits deliver_signals buffer_signal "
    "buffer_signal_bounded list_buffered_signals count_buffered_signals "
    "purge_buffered_signals buffer_event list_buffered_events remove_buffered_event "
    "list_runs count_runs run_facets run_value_facets lease_owners"
).split()


def test_the_derived_plan_equals_the_hand_written_one() -> None:
    methods = contract_methods(StateStore)
    assert tuple(methods) == STORE_METHODS
    assert CodecStateStore._contract_methods == STORE_METHODS
    for name in HAND_WRITTEN_METHODS:
        encoded, result = plan_method(StateStore, name, methods[name])
        assert list(encoded) == HAND_WRITTEN_ENCODED.get(name, []), name
        assert (result is not None) == (name in HAND_WRITTEN_DECODED), name


def test_every_contract_method_belongs_to_exactly_one_role() -> None:
    by_role = [name for role in STORE_ROLES for name in contract_methods(role)]
    assert len(by_role) == len(set(by_role)), "a method declared by two roles"
    assert tuple(by_role) == STORE_METHODS == tuple(contract_methods(StateStore))
    assert {METHOD_ROLES[name] for name in STORE_METHODS} == {r.__name__ for r in STORE_ROLES}


def test_derived_methods_keep_the_protocol_signatures() -> None:
    for name, fn in contract_methods(StateStore).items():
        method = getattr(CodecStateStore, name)
        assert method.__name__ == name and method.__qualname__ == f"CodecStateStore.{name}"
        assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(fn), name
        assert inspect.signature(method) == inspect.signature(fn), name
    assert "payloads encoded in: cp" in (CodecStateStore.save_checkpoint.__doc__ or "")


# ---------------------------------------------------------------- 2. a new method is covered


@dataclass(frozen=True, slots=True)
class ArchiveRow:
    """A new model: its `memo` is a payload because its annotation says so."""

    run_id: str
    memo: Payload
    size: int = 0


class WiderStore(StateStore, Protocol):
    """`StateStore` plus methods the codec has never heard of."""

    async def archive(
        self, runs: Sequence[WorkflowRun], note: Payload, *, reason: str, extra: Payload = None
    ) -> list[tuple[str, StepCheckpoint | None]]: ...
    async def stamp(self, waits: Mapping[str, ChildWait]) -> dict[str, BufferedEvent]: ...
    async def rows(self, rows: tuple[ArchiveRow, ...]) -> ArchiveRow | None: ...
    async def patch_many(self, patches: list[tuple[str, RunPatch]]) -> BufferedSignal: ...
    async def plain(self, token: str, waiter: SignalWaiter) -> int: ...


class WiderMemory(InMemoryStateStore):
    """The inner store: records what it receives and answers with it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    async def archive(
        self, runs: Sequence[WorkflowRun], note: Any, *, reason: str, extra: Any = None
    ) -> list[tuple[str, StepCheckpoint | None]]:
        self.seen.append((list(runs), note, reason, extra))
        return [(r.id, make_cp(r.id, 0, input=r.input, output=note)) for r in runs] + [("x", None)]

    async def stamp(self, waits: Mapping[str, ChildWait]) -> dict[str, BufferedEvent]:
        self.seen.append(dict(waits))
        return {
            k: BufferedEvent(
                id=k, name="n", payload=w.placeholder and w.placeholder.input, published_at=1
            )
            for k, w in waits.items()
        }

    async def rows(self, rows: tuple[ArchiveRow, ...]) -> ArchiveRow | None:
        self.seen.append(rows)
        return rows[0] if rows else None

    async def patch_many(self, patches: list[tuple[str, RunPatch]]) -> BufferedSignal:
        self.seen.append(patches)
        return BufferedSignal(payload=patches[0][1].get("output"))

    async def plain(self, token: str, waiter: SignalWaiter) -> int:
        self.seen.append((token, waiter))
        return 7


class WiderCodecStore(derive_codec_methods(WiderStore), CodecStateStore):  # type: ignore[misc]
    pass


async def test_a_new_contract_method_is_encoded_and_decoded_without_touching_the_codec() -> None:
    inner = WiderMemory()
    store: Any = WiderCodecStore(inner, TagCodec())

    answer = await store.archive(
        [make_run("a", input={"card": 1}), make_run("b", input=None)], "note", reason="why"
    )
    runs, note, reason, extra = inner.seen[-1]
    assert [r.input for r in runs] == [enc({"card": 1}), None]
    assert note == enc("note") and reason == "why" and extra is None
    assert answer == [
        ("a", make_cp("a", 0, input={"card": 1}, output="note")),
        ("b", make_cp("b", 0, input=None, output="note")),
        ("x", None),
    ]
    await store.archive([], note="kw", reason="r", extra=[1])  # keywords are encoded too
    assert inner.seen[-1][1:] == (enc("kw"), "r", enc([1]))

    wait = ChildWait(
        waiter=SignalWaiter(token="t", run_id="a", seq=0), placeholder=make_cp(input={"p": 1})
    )
    stamped = await store.stamp({"k": wait, "none": ChildWait(waiter=wait.waiter)})
    seen = inner.seen[-1]
    assert seen["k"].placeholder.input == enc({"p": 1}) and seen["none"].placeholder is None
    assert seen["k"].waiter is wait.waiter  # payload-free parts are not copied
    assert stamped["k"].payload == {"p": 1} and stamped["none"].payload is None

    row = await store.rows((ArchiveRow("a", {"m": 1}, size=3), ArchiveRow("b", None)))
    assert inner.seen[-1] == (ArchiveRow("a", enc({"m": 1}), size=3), ArchiveRow("b", None))
    assert row == ArchiveRow("a", {"m": 1}, size=3)
    assert await store.rows(()) is None

    hit = await store.patch_many([("a", {"output": "o", "status": "completed"}), ("b", {})])
    assert inner.seen[-1] == [("a", {"output": enc("o"), "status": "completed"}), ("b", {})]
    assert hit == BufferedSignal(payload="o")

    waiter = SignalWaiter(token="t", run_id="a", seq=0)
    assert await store.plain("t", waiter) == 7
    assert inner.seen[-1] == ("t", waiter)
    assert "archive" in WiderCodecStore._contract_methods


def test_a_store_lacking_a_method_of_the_wider_contract_is_refused() -> None:
    with pytest.raises(TypeError, match="InMemoryStateStore lacks archive, stamp, rows"):
        WiderCodecStore(InMemoryStateStore(), TagCodec())


# ---------------------------------------------------------------- 3. refusals


class Unmarked(Protocol):
    async def stash(self, token: str, value: JSONValue) -> None: ...


class AnyResult(Protocol):
    async def peek(self, token: str) -> Any: ...


class Opaque:
    def __init__(self, value: Any) -> None:
        self.value = value


class UnknownClass(Protocol):
    async def put(self, item: Opaque) -> None: ...


class TwoCarriers(Protocol):
    async def put(self, item: WorkflowRun | StepCheckpoint) -> None: ...


@dataclass(frozen=True)
class Memo:
    run_id: str
    body: JSONValue  # neither Payload nor a known clear field


class UnmarkedField(Protocol):
    async def memos(self, run_id: str) -> list[Memo]: ...


class LooseMapping(Protocol):
    async def put(self, values: dict[str, Any]) -> None: ...


class StarPayloads(Protocol):
    async def put(self, *values: Payload) -> None: ...


class MarkedModel(Protocol):
    async def put(self, run: Payload | WorkflowRun) -> None: ...


class NoAnnotation(Protocol):
    async def put(self, value) -> None: ...  # type: ignore[no-untyped-def]


class PayloadKeys(Protocol):
    async def put(self, values: dict[Payload, int]) -> None: ...


@pytest.mark.parametrize(
    ("contract", "message"),
    [
        (Unmarked, r"Unmarked\.stash parameter 'value': an unmarked JSON value"),
        (AnyResult, r"AnyResult\.peek return value: an unmarked JSON value"),
        (UnknownClass, r"UnknownClass\.put parameter 'item': Opaque is neither"),
        (TwoCarriers, r"TwoCarriers\.put parameter 'item': a union"),
        (UnmarkedField, r"UnmarkedField\.memos return value → Memo\.body: an unmarked JSON"),
        (LooseMapping, r"LooseMapping\.put parameter 'values': an unmarked JSON value"),
        (StarPayloads, r"StarPayloads\.put: payloads in \*values"),
        (MarkedModel, r"MarkedModel\.put parameter 'run': a union"),
        (NoAnnotation, r"NoAnnotation\.put: parameter 'value' has no annotation"),
        (PayloadKeys, r"PayloadKeys\.put parameter 'values': a mapping keyed by payloads"),
    ],
)
def test_an_unclassifiable_annotation_is_refused(contract: type, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        derive_codec_methods(contract)


def test_an_unclassifiable_store_method_fails_the_import_of_durably() -> None:
    """The derivation runs when the codec module is imported: a contract method the converter
    cannot classify stops durably from loading at all (here: reloading the module after a
    method with an unmarked JSON parameter joined `StateStore`)."""
    script = textwrap.dedent(
        """
        import importlib
        import durably._store.codec as codec
        from durably._store.protocol import StateStore

        async def stash(self, token: str, value: "JSONValue") -> None: ...
        from durably._core.models import JSONValue
        StateStore.stash = stash
        try:
            importlib.reload(codec)
        except TypeError as exc:
            print("REFUSED:", exc)
        else:
            print("IMPORTED")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "REFUSED: durably's data converter cannot classify StateStore.stash parameter" in out


# ---------------------------------------------------------------- 4. DataConverter


def test_the_converter_returns_values_without_payloads_as_they_are() -> None:
    converter = DataConverter(TagCodec())
    bare = make_run("r", input=None)
    assert converter.encode(bare, WorkflowRun) is bare
    patch: RunPatch = {"status": "completed", "wake_at": None}
    assert converter.encode(patch, RunPatch) is patch
    assert converter.encode(None, WorkflowRun | None) is None
    cleared: RunPatch = {"output": None}
    assert converter.encode(cleared, RunPatch) == {"output": None}
    run = make_run("r", input={"a": 1})
    sealed = converter.encode(run, WorkflowRun)
    assert sealed.input == enc({"a": 1}) and sealed.tags == run.tags
    assert converter.decode(sealed, WorkflowRun) == run
    assert converter.encode_payload(None) is None and converter.decode_payload(None) is None
    assert converter.decode(
        converter.encode([("t", 1)], list[tuple[str, Payload]]), list[tuple[str, Payload]]
    ) == [("t", 1)]


def test_without_a_codec_the_converter_is_the_identity() -> None:
    converter = DataConverter()
    run = make_run("r", input={"a": 1})
    assert converter.encode(run, WorkflowRun) == run
    assert converter.decode_payload({"x": 1}) == {"x": 1}
