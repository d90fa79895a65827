"""`durably.testing.crash.CrashableStore`: the whole store contract, written out; counting
writes by kind; dying like a killed process."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import pytest

from durably import InMemoryStateStore
from durably._core.models import CheckpointKind, CheckpointStatus, RunQuery, StepCheckpoint
from durably._store.codec import contract_methods
from durably._store.protocol import STORE_METHODS, StateStore, require_store
from durably.testing import StoreCrashed
from durably.testing.crash import CrashableStore, WriteLog
from durably.testing.skipping import deadline_kind


def test_every_contract_method_is_written_out_on_the_class() -> None:
    store = CrashableStore(InMemoryStateStore(), WriteLog())
    assert require_store(store) is store
    contract = contract_methods(StateStore)
    for name in STORE_METHODS:
        # Defined on the class itself (no forwarding by name lookup), with the same
        # parameters as the contract.
        assert name in vars(CrashableStore), name
        ours = inspect.signature(vars(CrashableStore)[name]).parameters
        theirs = inspect.signature(contract[name]).parameters
        assert list(ours) == list(theirs), name
        assert [p.default for p in ours.values()] == [p.default for p in theirs.values()], name
    assert "__getattr__" not in vars(CrashableStore)


_AT = datetime(2030, 1, 1, tzinfo=UTC)


def _cp(
    seq: int, name: str, *, wake_at: int | None = None, kind: CheckpointKind = "sleep"
) -> StepCheckpoint:
    status: CheckpointStatus = "completed" if kind == "sleep" else "failed"
    return StepCheckpoint(
        run_id="r",
        seq=seq,
        name=name,
        kind=kind,
        step_id=f"r:{seq}",
        status=status,
        started_at=_AT,
        finished_at=_AT,
        wake_at=wake_at,
    )


async def test_the_nth_write_lands_then_every_call_raises() -> None:
    inner = InMemoryStateStore()
    log = WriteLog()
    store = CrashableStore(inner, log)
    await store.ensure_schema()
    hold = await store.hold_instance("me")
    assert hold is not None
    store.crash_after(2, kind="checkpoint")
    await store.save_checkpoint(_cp(0, "a"))
    with pytest.raises(StoreCrashed, match="write 2"):
        await store.save_checkpoint(_cp(1, "b"))
    assert [cp.seq for cp in await inner.list_checkpoints("r")] == [0, 1]  # it landed
    assert store.writes("checkpoint") == 2 and log.count == 2
    for call in (store.get_run("r"), store.list_runs(RunQuery()), store.release_run_lock("r")):
        with pytest.raises(StoreCrashed):
            await call
    # A dead process's instance hold is gone: a successor takes the id at once.
    assert await inner.hold_instance("me") is not None
    await hold.release()  # the dead engine's own release is harmless


def test_what_backs_a_wake_time() -> None:
    assert deadline_kind(5, [_cp(0, "sleep", wake_at=5)]) == "timer"
    assert deadline_kind(5, [_cp(0, "timeout:go", wake_at=5)]) == "outside"
    assert deadline_kind(5, [_cp(0, "timeout:event:paid", wake_at=5)]) == "outside"
    assert deadline_kind(5, [_cp(0, "timeout:child:c1", wake_at=5)]) == "timer"
    assert deadline_kind(5, [_cp(0, "s", kind="local", wake_at=5)]) == "timer"  # a back-off
    assert deadline_kind(5, [_cp(0, "sleep", wake_at=4)]) is None  # a safety-net re-check
