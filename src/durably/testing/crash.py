"""`CrashableStore`: the store as the environment's engine sees it — every call handed to the
real store, every write counted, and a simulated death of the process on request.

The environment puts one in front of its store for each engine it builds (and one, that
never dies, for its client). It does three things, and nothing to the data:

- counts the writes, by kind, so `WorkflowEnvironment.crash_after(n, kind=...)` can pick
  the n-th: `"checkpoint"` (a step checkpoint saved by a run's turn: the single and batch
  saves and the fold of a fan's rows), `"run_update"` (a run row patched: status changes,
  leases written through a patch) or `"write"` (any call that may change the store);
- tells the time skipper that something was written (`WriteLog`), so it never jumps the
  clock while work is landing (`durably.testing.skipping`);
- dies like the process it stands for. The n-th write of the kind is carried out — it
  reached the database — and then the call raises `StoreCrashed`, as if the process died
  right after the commit and before it could act on the answer (the harder case for
  recovery: the engine did not see its own write). From then on every call raises
  `StoreCrashed`, so that engine writes nothing more, and the instance hold it took is let
  go, as a dead process's hold is. The real store is untouched and shared: a new engine
  over a new wrapper (`WorkflowEnvironment.restart`) finds everything that landed.

Every method of the store contract is written out below, typed as the contract declares it
(a test checks the list against `durably._store.protocol.STORE_METHODS`), so the type
checker sees each one; nothing is forwarded by name lookup. Closing the wrapper leaves the
real store open: the environment owns it and closes it once, at its exit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Literal

from durably._core.aggregates import CheckpointQuery, CheckpointStat
from durably._core.buffered_signals import BufferedSignalInfo, BufferScope
from durably._core.models import (
    BufferedEvent,
    BufferedSignal,
    ChildWait,
    RunPatch,
    RunQuery,
    RunStatus,
    SignalWaiter,
    StepCheckpoint,
    WorkflowRun,
)
from durably._core.quota import StartGate, StartOutcome
from durably._core.retention import RetentionPolicy
from durably._core.run_activity import ActivityBucket, ActivityWindow
from durably._core.run_facets import (
    LeaseOwnerRow,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
)
from durably._core.schedules import ScheduleQuery, ScheduleRecord
from durably._core.worker_beats import WorkerBeat
from durably._store.protocol import InstanceHold, Payload, StateStore, WakeBus

__all__ = ["CRASH_KINDS", "CrashKind", "CrashableStore", "StoreCrashed", "WriteLog"]

CrashKind = Literal["checkpoint", "run_update", "write"]
CRASH_KINDS: tuple[CrashKind, ...] = ("checkpoint", "run_update", "write")

# What each write is counted as besides "write" ("other": only as a write).
_Kind = Literal["checkpoint", "run_update", "other"]


class StoreCrashed(RuntimeError):
    """The simulated death of the process an environment's engine stands for
    (`WorkflowEnvironment.crash_after`): raised by the write that "killed" it and by every
    store call after it."""


class WriteLog:
    """How many writes every wrapper of one environment has passed on, and who to tell: the
    time skipper compares the count before and after it looks, and is woken by each."""

    def __init__(self) -> None:
        self.count = 0
        self._listeners: list[Callable[[], None]] = []

    def listen(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def wrote(self) -> None:
        self.count += 1
        for listener in self._listeners:
            listener()


class _Hold:
    """An instance hold taken through a wrapper: released by its engine, or by the wrapper
    when the process it stands for dies."""

    def __init__(self, inner: InstanceHold, holds: list[_Hold]):
        self._inner: InstanceHold | None = inner
        self._holds = holds
        holds.append(self)

    async def release(self) -> None:
        inner, self._inner = self._inner, None
        if inner is None:
            return
        if self in self._holds:
            self._holds.remove(self)
        await inner.release()


class CrashableStore:
    """A complete `StateStore` over `inner` that counts writes and can die (module doc)."""

    def __init__(self, inner: StateStore, log: WriteLog):
        self._inner = inner
        self._log = log
        self._counts: Counter[str] = Counter()
        self._crash_at: tuple[CrashKind, int] | None = None
        self._holds: list[_Hold] = []
        self.crashed = False

    @property
    def inner(self) -> StateStore:
        """The real store."""
        return self._inner

    def writes(self, kind: CrashKind = "write") -> int:
        """How many writes of `kind` this wrapper has passed on."""
        return self._counts[kind]

    def crash_after(self, n: int, kind: CrashKind = "checkpoint") -> None:
        """Die after the `n`-th write of `kind` from now on (module doc)."""
        if kind not in CRASH_KINDS:
            raise ValueError(f"crash kind {kind!r}: one of {', '.join(CRASH_KINDS)}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"crash_after({n!r}): a whole number of writes >= 1")
        self._crash_at = (kind, self._counts[kind] + n)

    def _alive(self) -> None:
        if self.crashed:
            raise StoreCrashed("the store's process has crashed (WorkflowEnvironment.crash_after)")

    async def _wrote(self, kind: _Kind) -> None:
        self._counts["write"] += 1
        if kind != "other":
            self._counts[kind] += 1
        self._log.wrote()
        crash = self._crash_at
        if crash is not None and self._counts[crash[0]] >= crash[1]:
            await self.crash()
            raise StoreCrashed(f"crashed after write {crash[1]} of kind {crash[0]!r}")

    async def crash(self) -> None:
        """Die now: every later call raises `StoreCrashed`; the instance holds taken through
        this wrapper are let go, as a dead process's are."""
        self.crashed = True
        self._crash_at = None
        for hold in list(self._holds):
            await hold.release()

    # ------------------------------------------------------------------ the contract

    async def ensure_schema(self) -> None:
        self._alive()
        await self._inner.ensure_schema()

    async def close(self) -> None:
        """Nothing: the real store belongs to the environment, which closes it at exit."""

    def wake_bus(self) -> WakeBus | None:
        return self._inner.wake_bus()

    async def hold_instance(self, instance_id: str) -> InstanceHold | None:
        self._alive()
        hold = await self._inner.hold_instance(instance_id)
        return None if hold is None else _Hold(hold, self._holds)

    async def create_run(self, run: WorkflowRun) -> None:
        self._alive()
        await self._inner.create_run(run)
        await self._wrote("other")

    async def create_runs(self, runs: Sequence[WorkflowRun]) -> list[str | None]:
        self._alive()
        result = await self._inner.create_runs(runs)
        await self._wrote("other")
        return result

    async def update_run(self, run_id: str, patch: RunPatch) -> None:
        self._alive()
        await self._inner.update_run(run_id, patch)
        await self._wrote("run_update")

    async def update_run_if_status(
        self,
        run_id: str,
        patch: RunPatch,
        statuses: Sequence[RunStatus],
    ) -> bool:
        self._alive()
        result = await self._inner.update_run_if_status(run_id, patch, statuses)
        await self._wrote("run_update")
        return result

    async def get_run(self, run_id: str) -> WorkflowRun | None:
        self._alive()
        return await self._inner.get_run(run_id)

    async def delete_run(self, run_id: str) -> None:
        self._alive()
        await self._inner.delete_run(run_id)
        await self._wrote("other")

    async def get_checkpoint(self, run_id: str, seq: int) -> StepCheckpoint | None:
        self._alive()
        return await self._inner.get_checkpoint(run_id, seq)

    async def save_checkpoint(self, cp: StepCheckpoint) -> None:
        self._alive()
        await self._inner.save_checkpoint(cp)
        await self._wrote("checkpoint")

    async def save_checkpoint_if_pending(self, cp: StepCheckpoint) -> bool:
        self._alive()
        result = await self._inner.save_checkpoint_if_pending(cp)
        await self._wrote("checkpoint")
        return result

    async def save_checkpoints_if_pending(self, cps: Sequence[StepCheckpoint]) -> list[bool]:
        self._alive()
        result = await self._inner.save_checkpoints_if_pending(cps)
        await self._wrote("checkpoint")
        return result

    async def save_checkpoints(self, cps: Sequence[StepCheckpoint]) -> None:
        self._alive()
        await self._inner.save_checkpoints(cps)
        await self._wrote("checkpoint")

    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]:
        self._alive()
        return await self._inner.list_checkpoints(run_id)

    async def get_latest_checkpoint_by_name(self, run_id: str, name: str) -> StepCheckpoint | None:
        self._alive()
        return await self._inner.get_latest_checkpoint_by_name(run_id, name)

    async def list_checkpoints_by_name_prefix(
        self,
        run_id: str,
        prefixes: Sequence[str],
    ) -> list[StepCheckpoint]:
        self._alive()
        return await self._inner.list_checkpoints_by_name_prefix(run_id, prefixes)

    async def count_checkpoints(
        self,
        run_id: str,
        from_seq: int,
        to_seq: int,
        statuses: Sequence[str],
    ) -> int:
        self._alive()
        return await self._inner.count_checkpoints(run_id, from_seq, to_seq, statuses)

    async def fold_checkpoints(
        self,
        run_id: str,
        first_seq: int,
        last_seq: int,
        cp: StepCheckpoint,
    ) -> None:
        self._alive()
        await self._inner.fold_checkpoints(run_id, first_seq, last_seq, cp)
        await self._wrote("checkpoint")

    async def list_incomplete_runs(self, namespace: str | None = None) -> list[WorkflowRun]:
        self._alive()
        return await self._inner.list_incomplete_runs(namespace)

    async def list_due_timers(
        self,
        now_ms: int,
        namespace: str | None = None,
        limit: int | None = None,
    ) -> list[WorkflowRun]:
        self._alive()
        return await self._inner.list_due_timers(now_ms, namespace, limit)

    async def list_orphaned_suspended(
        self,
        now_ms: int,
        namespace: str | None = None,
        limit: int = 100,
    ) -> list[WorkflowRun]:
        self._alive()
        return await self._inner.list_orphaned_suspended(now_ms, namespace, limit)

    async def release_run_lock(self, run_id: str) -> None:
        self._alive()
        await self._inner.release_run_lock(run_id)
        await self._wrote("other")

    async def renew_run_locks(self, owner: str, lease_until_ms: int) -> int:
        self._alive()
        result = await self._inner.renew_run_locks(owner, lease_until_ms)
        await self._wrote("other")
        return result

    async def release_locks_of(self, owner: str) -> int:
        self._alive()
        result = await self._inner.release_locks_of(owner)
        await self._wrote("other")
        return result

    async def claim_run(
        self,
        run_id: str,
        owner: str,
        lease_until_ms: int,
        now_ms: int,
    ) -> WorkflowRun | None:
        self._alive()
        result = await self._inner.claim_run(run_id, owner, lease_until_ms, now_ms)
        await self._wrote("other")
        return result

    async def claim_runs(
        self,
        ids: Sequence[str],
        owner: str,
        lease_until_ms: int,
        now_ms: int,
    ) -> list[WorkflowRun]:
        self._alive()
        result = await self._inner.claim_runs(ids, owner, lease_until_ms, now_ms)
        await self._wrote("other")
        return result

    async def claim_pending_runs(
        self,
        owner: str,
        lease_until_ms: int,
        now_ms: int,
        limit: int,
        namespace: str | None = None,
    ) -> list[WorkflowRun]:
        self._alive()
        result = await self._inner.claim_pending_runs(
            owner, lease_until_ms, now_ms, limit, namespace
        )
        await self._wrote("other")
        return result

    async def put_signal_waiter(self, waiter: SignalWaiter) -> None:
        self._alive()
        await self._inner.put_signal_waiter(waiter)
        await self._wrote("other")

    async def list_signal_waiters(self, prefix: str) -> list[SignalWaiter]:
        self._alive()
        return await self._inner.list_signal_waiters(prefix)

    async def remove_signal_waiter(self, waiter: SignalWaiter) -> None:
        self._alive()
        await self._inner.remove_signal_waiter(waiter)
        await self._wrote("other")

    async def register_child_waits(self, waits: Sequence[ChildWait]) -> None:
        self._alive()
        await self._inner.register_child_waits(waits)
        await self._wrote("other")

    async def deliver_signals(
        self,
        payloads: Sequence[tuple[str, Payload]],
        at: datetime,
    ) -> list[StepCheckpoint]:
        self._alive()
        result = await self._inner.deliver_signals(payloads, at)
        await self._wrote("other")
        return result

    async def buffer_signal(self, token: str, payload: Payload) -> None:
        self._alive()
        await self._inner.buffer_signal(token, payload)
        await self._wrote("other")

    async def peek_buffered_signals(self, token: str, limit: int) -> list[BufferedSignal]:
        self._alive()
        return await self._inner.peek_buffered_signals(token, limit)

    async def take_buffered_signal_into(
        self,
        token: str,
        cp: StepCheckpoint,
        *,
        waiting: bool = False,
    ) -> BufferedSignal | None:
        self._alive()
        result = await self._inner.take_buffered_signal_into(token, cp, waiting=waiting)
        await self._wrote("other")
        return result

    async def deliver_buffered_signal(self, token: str, at: datetime) -> StepCheckpoint | None:
        self._alive()
        result = await self._inner.deliver_buffered_signal(token, at)
        await self._wrote("other")
        return result

    async def buffer_signal_bounded(
        self,
        token: str,
        payload: Payload,
        *,
        ttl_ms: int,
        per_token: int,
        per_namespace: int,
    ) -> BufferScope | None:
        self._alive()
        result = await self._inner.buffer_signal_bounded(
            token, payload, ttl_ms=ttl_ms, per_token=per_token, per_namespace=per_namespace
        )
        await self._wrote("other")
        return result

    async def list_buffered_signals(
        self,
        *,
        prefix: str | None,
        limit: int,
        offset: int,
    ) -> list[BufferedSignalInfo]:
        self._alive()
        return await self._inner.list_buffered_signals(prefix=prefix, limit=limit, offset=offset)

    async def count_buffered_signals(self, *, prefix: str | None = None) -> int:
        self._alive()
        return await self._inner.count_buffered_signals(prefix=prefix)

    async def purge_buffered_signals(
        self,
        *,
        token: str | None = None,
        prefix: str | None = None,
        expired_only: bool = False,
    ) -> int:
        self._alive()
        result = await self._inner.purge_buffered_signals(
            token=token, prefix=prefix, expired_only=expired_only
        )
        await self._wrote("other")
        return result

    async def buffer_event(self, event: BufferedEvent) -> None:
        self._alive()
        await self._inner.buffer_event(event)
        await self._wrote("other")

    async def buffer_event_bounded(
        self,
        event: BufferedEvent,
        *,
        ttl_ms: int,
        per_name: int,
        per_namespace: int,
    ) -> BufferScope | None:
        self._alive()
        result = await self._inner.buffer_event_bounded(
            event, ttl_ms=ttl_ms, per_name=per_name, per_namespace=per_namespace
        )
        await self._wrote("other")
        return result

    async def purge_expired_events(self, published_before_ms: int) -> int:
        self._alive()
        result = await self._inner.purge_expired_events(published_before_ms)
        await self._wrote("other")
        return result

    async def list_buffered_events(self, name: str, limit: int) -> list[BufferedEvent]:
        self._alive()
        return await self._inner.list_buffered_events(name, limit)

    async def remove_buffered_event(self, event_id: str) -> bool:
        self._alive()
        result = await self._inner.remove_buffered_event(event_id)
        await self._wrote("other")
        return result

    async def take_buffered_event_into(self, event_id: str, token: str, cp: StepCheckpoint) -> bool:
        self._alive()
        result = await self._inner.take_buffered_event_into(event_id, token, cp)
        await self._wrote("other")
        return result

    async def deliver_buffered_event(
        self,
        event_id: str,
        token: str,
        at: datetime,
    ) -> StepCheckpoint | None:
        self._alive()
        result = await self._inner.deliver_buffered_event(event_id, token, at)
        await self._wrote("other")
        return result

    async def list_runs(self, query: RunQuery) -> list[WorkflowRun]:
        self._alive()
        return await self._inner.list_runs(query)

    async def count_runs(self, query: RunQuery) -> int:
        self._alive()
        return await self._inner.count_runs(query)

    async def run_facets(self, query: RunQuery) -> list[RunFacetRow]:
        self._alive()
        return await self._inner.run_facets(query)

    async def run_value_facets(
        self,
        axis: RunValueAxis,
        query: RunQuery,
        opts: RunValueFacetOptions | None = None,
    ) -> list[RunValueFacetRow]:
        self._alive()
        return await self._inner.run_value_facets(axis, query, opts)

    async def run_activity(self, query: RunQuery, window: ActivityWindow) -> list[ActivityBucket]:
        self._alive()
        return await self._inner.run_activity(query, window)

    async def lease_owners(self, now_ms: int, namespace: str | None = None) -> list[LeaseOwnerRow]:
        self._alive()
        return await self._inner.lease_owners(now_ms, namespace)

    async def checkpoint_stats(self, run_id: str, group: str | None = None) -> list[CheckpointStat]:
        self._alive()
        return await self._inner.checkpoint_stats(run_id, group)

    async def query_checkpoints(self, run_id: str, query: CheckpointQuery) -> list[StepCheckpoint]:
        self._alive()
        return await self._inner.query_checkpoints(run_id, query)

    async def create_run_gated(self, run: WorkflowRun, gate: StartGate) -> StartOutcome:
        self._alive()
        result = await self._inner.create_run_gated(run, gate)
        await self._wrote("other")
        return result

    async def gate_untagged_run(
        self,
        run_id: str,
        new_tags: Sequence[str],
        gate: StartGate,
    ) -> StartOutcome:
        self._alive()
        result = await self._inner.gate_untagged_run(run_id, new_tags, gate)
        await self._wrote("other")
        return result

    async def try_admit_singleton(
        self,
        run_id: str,
        tag: str,
        workflow: str,
        limit: int,
        retry_wake_at_ms: int,
    ) -> bool:
        self._alive()
        result = await self._inner.try_admit_singleton(
            run_id, tag, workflow, limit, retry_wake_at_ms
        )
        await self._wrote("other")
        return result

    async def wake_singleton_waiters(
        self,
        tag: str,
        workflow: str,
        limit: int,
        now_ms: int,
    ) -> list[str]:
        self._alive()
        result = await self._inner.wake_singleton_waiters(tag, workflow, limit, now_ms)
        await self._wrote("other")
        return result

    async def beat_worker(self, beat: WorkerBeat) -> None:
        self._alive()
        await self._inner.beat_worker(beat)
        await self._wrote("other")

    async def list_worker_beats(
        self,
        namespace: str | None,
        since_ms: int,
        limit: int,
    ) -> list[WorkerBeat]:
        self._alive()
        return await self._inner.list_worker_beats(namespace, since_ms, limit)

    async def forget_worker(self, namespace: str, instance_id: str) -> None:
        self._alive()
        await self._inner.forget_worker(namespace, instance_id)
        await self._wrote("other")

    async def prune_worker_beats(self, before_ms: int) -> int:
        self._alive()
        result = await self._inner.prune_worker_beats(before_ms)
        await self._wrote("other")
        return result

    async def prune_terminal_runs(
        self,
        policy: RetentionPolicy,
        now_ms: int,
        limit: int,
        *,
        dry_run: bool = False,
    ) -> list[str]:
        self._alive()
        result = await self._inner.prune_terminal_runs(policy, now_ms, limit, dry_run=dry_run)
        await self._wrote("other")
        return result

    async def put_schedule(
        self,
        record: ScheduleRecord,
        *,
        if_absent: bool = False,
        expected_updated_at: int | None = None,
    ) -> bool:
        self._alive()
        result = await self._inner.put_schedule(
            record, if_absent=if_absent, expected_updated_at=expected_updated_at
        )
        await self._wrote("other")
        return result

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        self._alive()
        return await self._inner.get_schedule(schedule_id)

    async def delete_schedule(self, schedule_id: str) -> bool:
        self._alive()
        result = await self._inner.delete_schedule(schedule_id)
        await self._wrote("other")
        return result

    async def list_schedules(self, query: ScheduleQuery) -> list[ScheduleRecord]:
        self._alive()
        return await self._inner.list_schedules(query)
