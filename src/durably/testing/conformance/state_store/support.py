"""Models and helpers the state-store cases share: runs and checkpoints at fixed times, and
the takes, claims and pick-ups written through the contract itself."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from durably import AttributeFilter, RunQuery, SignalWaiter, StateStore, StepCheckpoint, WorkflowRun
from durably._core.models import BufferedSignal
from durably._store.protocol import LeaseStore, SignalStore

# ------------------------------------------------------------------ the store's clock


class StoreClock:
    """The time a store reads: the wall clock (UTC) plus an offset the cases move forward,
    so expiry is checked without waiting. Call it for the time."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, **delta: float) -> None:
        """Move the time on by `timedelta(**delta)` (`hours=1`, `seconds=2`, …)."""
        self.offset += timedelta(**delta)


# ------------------------------------------------------------------ models

T0 = datetime(2026, 6, 11, tzinfo=UTC)


def at(minutes: int = 0, *, ms: int = 0) -> datetime:
    return T0 + timedelta(minutes=minutes, milliseconds=ms)


def make_run(run_id: str = "r1", **kw: Any) -> WorkflowRun:
    fields: dict[str, Any] = {
        "id": run_id,
        "workflow": "checkout",
        "workflow_version": "1",
        "status": "running",
        "input": {"orderId": "o1"},
        "created_at": T0,
        "updated_at": T0,
    }
    fields.update(kw)
    return WorkflowRun(**fields)


def make_cp(run_id: str = "r1", seq: int = 0, **kw: Any) -> StepCheckpoint:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "seq": seq,
        "name": "reserve",
        "kind": "local",
        "step_id": f"{run_id}:{seq}",
        "status": "completed",
        "output": {"ok": True},
        "attempts": 1,
        "started_at": T0,
        "finished_at": T0,
    }
    fields.update(kw)
    return StepCheckpoint(**fields)


async def ids(store: StateStore, query: RunQuery) -> list[str]:
    return [r.id for r in await store.list_runs(query)]


async def id_set(store: StateStore, query: RunQuery) -> set[str]:
    return set(await ids(store, query))


async def seed_attrs(store: StateStore) -> None:
    rows: list[tuple[str, str, dict[str, Any] | None]] = [
        ("a", "running", {"tier": "free", "amount": 10, "vip": True}),
        ("b", "running", {"tier": "pro", "amount": 200, "vip": False}),
        ("c", "completed", {"tier": "pro", "amount": 55.5}),
        ("d", "running", {"tier": "enterprise"}),
        ("e", "running", None),
    ]
    for minute, (run_id, status, attrs) in enumerate(rows):
        await store.create_run(
            make_run(run_id, status=status, search_attributes=attrs, created_at=at(minute))
        )


def attr(key: str, op: Any, value: Any = None, values: Any = None) -> RunQuery:
    return RunQuery(attributes=[AttributeFilter(key, op, value, values)])


# ------------------------------------------------------------------ takes through the contract
# The engine takes a buffered signal or a waiter only as part of a delivery into a
# checkpoint, so the tests take them the same way, through the contract (any store, a codec
# store too), rather than through store methods of their own.

_TAKER_SEQS = itertools.count()


async def take_buffered(store: SignalStore, token: str) -> BufferedSignal | None:
    """The oldest live buffered signal of `token`, taken the way a wait takes it
    (`take_buffered_signal_into`): into a checkpoint of a run of its own, at a fresh seq each
    time, so no take is refused for a checkpoint already completed. None when none is live."""
    cp = make_cp("buffer-taker", next(_TAKER_SEQS), name=f"signal:{token}", kind="signal")
    return await store.take_buffered_signal_into(token, cp)


async def take_waiter(store: SignalStore, token: str) -> SignalWaiter | None:
    """The waiter of `token`, taken the way a sender takes it (`deliver_signals`, which
    also writes the waiter's `signal:` checkpoint); None when the token has none."""
    written = await store.deliver_signals([(token, None)], T0)
    if not written:
        return None
    [cp] = written
    return SignalWaiter(token, cp.run_id, cp.seq, cp.parallel_group)


async def try_lock(store: LeaseStore, run_id: str, owner: str, until: int, now: int) -> bool:
    """Whether `owner` got the run's lease (`claim_run`: free or expired leases only)."""
    return await store.claim_run(run_id, owner, until, now) is not None


async def pickup(store: LeaseStore, limit: int, namespace: str | None = None) -> list[WorkflowRun]:
    """The pending runs in pick-up order, up to `limit`, seen through `claim_pending_runs`
    with a lease that has already lapsed (`lease_until_ms == now_ms == 0`): the runs stay
    pending and claimable by anyone, so the listing can be repeated."""
    return await store.claim_pending_runs("pickup-probe", 0, 0, limit, namespace)
