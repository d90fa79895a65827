"""A third party proves its store with durably's state-store suite.

`DelegatingStore` is written the way another project would write a store of its own: a class
of its own (no durably base class) implementing every method of the `StateStore` contract
explicitly — here each one hands the call to an `InMemoryStateStore`, so the suite must pass.
The test class is all a store author adds to their own test suite.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime

from durably import (
    ActivityBucket,
    ActivityWindow,
    BufferedSignalInfo,
    InMemoryStateStore,
    RetentionPolicy,
    RunFacetRow,
    RunQuery,
    RunStatus,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    SignalWaiter,
    StateStore,
    StepCheckpoint,
    WorkflowRun,
)
from durably._core.aggregates import CheckpointQuery, CheckpointStat
from durably._core.buffered_signals import BufferScope
from durably._core.models import BufferedEvent, BufferedSignal, ChildWait, RunPatch
from durably._core.quota import StartGate, StartOutcome
from durably._core.run_facets import LeaseOwnerRow
from durably._core.schedules import ScheduleQuery, ScheduleRecord
from durably._core.worker_beats import WorkerBeat
from durably._store.protocol import InstanceHold, Payload, WakeBus, missing_store_methods
from durably.testing.conformance import StateStoreSuite, StoreClock


class DelegatingStore:
    """A store of its own: every contract method, each delegated to the in-memory store."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self._inner = InMemoryStateStore(clock=clock)

    async def ensure_schema(self) -> None:
        return await self._inner.ensure_schema()

    async def close(self) -> None:
        return await self._inner.close()

    async def create_run(self, run: WorkflowRun) -> None:
        return await self._inner.create_run(run)

    async def create_runs(self, runs: Sequence[WorkflowRun]) -> list[str | None]:
        return await self._inner.create_runs(runs)

    async def update_run(self, run_id: str, patch: RunPatch) -> None:
        return await self._inner.update_run(run_id, patch)

    async def update_run_if_status(
        self, run_id: str, patch: RunPatch, statuses: Sequence[RunStatus]
    ) -> bool:
        return await self._inner.update_run_if_status(run_id, patch, statuses)

    async def get_run(self, run_id: str) -> WorkflowRun | None:
        return await self._inner.get_run(run_id)

    async def delete_run(self, run_id: str) -> None:
        return await self._inner.delete_run(run_id)

    async def get_checkpoint(self, run_id: str, seq: int) -> StepCheckpoint | None:
        return await self._inner.get_checkpoint(run_id, seq)

    async def save_checkpoint(self, cp: StepCheckpoint) -> None:
        return await self._inner.save_checkpoint(cp)

    async def save_checkpoint_if_pending(self, cp: StepCheckpoint) -> bool:
        return await self._inner.save_checkpoint_if_pending(cp)

    async def save_checkpoints_if_pending(self, cps: Sequence[StepCheckpoint]) -> list[bool]:
        return await self._inner.save_checkpoints_if_pending(cps)

    async def save_checkpoints(self, cps: Sequence[StepCheckpoint]) -> None:
        return await self._inner.save_checkpoints(cps)

    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]:
        return await self._inner.list_checkpoints(run_id)

    async def get_latest_checkpoint_by_name(self, run_id: str, name: str) -> StepCheckpoint | None:
        return await self._inner.get_latest_checkpoint_by_name(run_id, name)

    async def list_checkpoints_by_name_prefix(
        self, run_id: str, prefixes: Sequence[str]
    ) -> list[StepCheckpoint]:
        return await self._inner.list_checkpoints_by_name_prefix(run_id, prefixes)

    async def count_checkpoints(
        self, run_id: str, from_seq: int, to_seq: int, statuses: Sequence[str]
    ) -> int:
        return await self._inner.count_checkpoints(run_id, from_seq, to_seq, statuses)

    async def fold_checkpoints(
        self, run_id: str, first_seq: int, last_seq: int, cp: StepCheckpoint
    ) -> None:
        return await self._inner.fold_checkpoints(run_id, first_seq, last_seq, cp)

    async def list_incomplete_runs(self, namespace: str | None = None) -> list[WorkflowRun]:
        return await self._inner.list_incomplete_runs(namespace)

    async def list_due_timers(
        self, now_ms: int, namespace: str | None = None, limit: int | None = None
    ) -> list[WorkflowRun]:
        return await self._inner.list_due_timers(now_ms, namespace, limit)

    async def list_orphaned_suspended(
        self, now_ms: int, namespace: str | None = None, limit: int = 100
    ) -> list[WorkflowRun]:
        return await self._inner.list_orphaned_suspended(now_ms, namespace, limit)

    async def release_run_lock(self, run_id: str) -> None:
        return await self._inner.release_run_lock(run_id)

    async def renew_run_locks(self, owner: str, lease_until_ms: int) -> int:
        return await self._inner.renew_run_locks(owner, lease_until_ms)

    async def release_locks_of(self, owner: str) -> int:
        return await self._inner.release_locks_of(owner)

    async def claim_run(
        self, run_id: str, owner: str, lease_until_ms: int, now_ms: int
    ) -> WorkflowRun | None:
        return await self._inner.claim_run(run_id, owner, lease_until_ms, now_ms)

    async def claim_runs(
        self, ids: Sequence[str], owner: str, lease_until_ms: int, now_ms: int
    ) -> list[WorkflowRun]:
        return await self._inner.claim_runs(ids, owner, lease_until_ms, now_ms)

    async def claim_pending_runs(
        self, owner: str, lease_until_ms: int, now_ms: int, limit: int, namespace: str | None = None
    ) -> list[WorkflowRun]:
        return await self._inner.claim_pending_runs(owner, lease_until_ms, now_ms, limit, namespace)

    async def hold_instance(self, instance_id: str) -> InstanceHold | None:
        return await self._inner.hold_instance(instance_id)

    def wake_bus(self) -> WakeBus | None:
        return self._inner.wake_bus()

    async def put_signal_waiter(self, waiter: SignalWaiter) -> None:
        return await self._inner.put_signal_waiter(waiter)

    async def list_signal_waiters(self, prefix: str) -> list[SignalWaiter]:
        return await self._inner.list_signal_waiters(prefix)

    async def remove_signal_waiter(self, waiter: SignalWaiter) -> None:
        return await self._inner.remove_signal_waiter(waiter)

    async def register_child_waits(self, waits: Sequence[ChildWait]) -> None:
        return await self._inner.register_child_waits(waits)

    async def deliver_signals(
        self, payloads: Sequence[tuple[str, Payload]], at: datetime
    ) -> list[StepCheckpoint]:
        return await self._inner.deliver_signals(payloads, at)

    async def buffer_signal(self, token: str, payload: Payload) -> None:
        return await self._inner.buffer_signal(token, payload)

    async def peek_buffered_signals(self, token: str, limit: int) -> list[BufferedSignal]:
        return await self._inner.peek_buffered_signals(token, limit)

    async def take_buffered_signal_into(
        self, token: str, cp: StepCheckpoint, *, waiting: bool = False
    ) -> BufferedSignal | None:
        return await self._inner.take_buffered_signal_into(token, cp, waiting=waiting)

    async def deliver_buffered_signal(self, token: str, at: datetime) -> StepCheckpoint | None:
        return await self._inner.deliver_buffered_signal(token, at)

    async def buffer_signal_bounded(
        self, token: str, payload: Payload, *, ttl_ms: int, per_token: int, per_namespace: int
    ) -> BufferScope | None:
        return await self._inner.buffer_signal_bounded(
            token, payload, ttl_ms=ttl_ms, per_token=per_token, per_namespace=per_namespace
        )

    async def list_buffered_signals(
        self, *, prefix: str | None, limit: int, offset: int
    ) -> list[BufferedSignalInfo]:
        return await self._inner.list_buffered_signals(prefix=prefix, limit=limit, offset=offset)

    async def count_buffered_signals(self, *, prefix: str | None = None) -> int:
        return await self._inner.count_buffered_signals(prefix=prefix)

    async def purge_buffered_signals(
        self, *, token: str | None = None, prefix: str | None = None, expired_only: bool = False
    ) -> int:
        return await self._inner.purge_buffered_signals(
            token=token, prefix=prefix, expired_only=expired_only
        )

    async def buffer_event(self, event: BufferedEvent) -> None:
        return await self._inner.buffer_event(event)

    async def buffer_event_bounded(
        self, event: BufferedEvent, *, ttl_ms: int, per_name: int, per_namespace: int
    ) -> BufferScope | None:
        return await self._inner.buffer_event_bounded(
            event, ttl_ms=ttl_ms, per_name=per_name, per_namespace=per_namespace
        )

    async def purge_expired_events(self, published_before_ms: int) -> int:
        return await self._inner.purge_expired_events(published_before_ms)

    async def list_buffered_events(self, name: str, limit: int) -> list[BufferedEvent]:
        return await self._inner.list_buffered_events(name, limit)

    async def remove_buffered_event(self, event_id: str) -> bool:
        return await self._inner.remove_buffered_event(event_id)

    async def take_buffered_event_into(self, event_id: str, token: str, cp: StepCheckpoint) -> bool:
        return await self._inner.take_buffered_event_into(event_id, token, cp)

    async def deliver_buffered_event(
        self, event_id: str, token: str, at: datetime
    ) -> StepCheckpoint | None:
        return await self._inner.deliver_buffered_event(event_id, token, at)

    async def list_runs(self, query: RunQuery) -> list[WorkflowRun]:
        return await self._inner.list_runs(query)

    async def count_runs(self, query: RunQuery) -> int:
        return await self._inner.count_runs(query)

    async def run_facets(self, query: RunQuery) -> list[RunFacetRow]:
        return await self._inner.run_facets(query)

    async def run_value_facets(
        self, axis: RunValueAxis, query: RunQuery, opts: RunValueFacetOptions | None = None
    ) -> list[RunValueFacetRow]:
        return await self._inner.run_value_facets(axis, query, opts)

    async def run_activity(self, query: RunQuery, window: ActivityWindow) -> list[ActivityBucket]:
        return await self._inner.run_activity(query, window)

    async def lease_owners(self, now_ms: int, namespace: str | None = None) -> list[LeaseOwnerRow]:
        return await self._inner.lease_owners(now_ms, namespace)

    async def checkpoint_stats(self, run_id: str, group: str | None = None) -> list[CheckpointStat]:
        return await self._inner.checkpoint_stats(run_id, group)

    async def query_checkpoints(self, run_id: str, query: CheckpointQuery) -> list[StepCheckpoint]:
        return await self._inner.query_checkpoints(run_id, query)

    async def create_run_gated(self, run: WorkflowRun, gate: StartGate) -> StartOutcome:
        return await self._inner.create_run_gated(run, gate)

    async def gate_untagged_run(
        self, run_id: str, new_tags: Sequence[str], gate: StartGate
    ) -> StartOutcome:
        return await self._inner.gate_untagged_run(run_id, new_tags, gate)

    async def try_admit_singleton(
        self, run_id: str, tag: str, workflow: str, limit: int, retry_wake_at_ms: int
    ) -> bool:
        return await self._inner.try_admit_singleton(run_id, tag, workflow, limit, retry_wake_at_ms)

    async def wake_singleton_waiters(
        self, tag: str, workflow: str, limit: int, now_ms: int
    ) -> list[str]:
        return await self._inner.wake_singleton_waiters(tag, workflow, limit, now_ms)

    async def beat_worker(self, beat: WorkerBeat) -> None:
        return await self._inner.beat_worker(beat)

    async def list_worker_beats(
        self, namespace: str | None, since_ms: int, limit: int
    ) -> list[WorkerBeat]:
        return await self._inner.list_worker_beats(namespace, since_ms, limit)

    async def forget_worker(self, namespace: str, instance_id: str) -> None:
        return await self._inner.forget_worker(namespace, instance_id)

    async def prune_worker_beats(self, before_ms: int) -> int:
        return await self._inner.prune_worker_beats(before_ms)

    async def prune_terminal_runs(
        self, policy: RetentionPolicy, now_ms: int, limit: int, *, dry_run: bool = False
    ) -> list[str]:
        return await self._inner.prune_terminal_runs(policy, now_ms, limit, dry_run=dry_run)

    async def put_schedule(
        self,
        record: ScheduleRecord,
        *,
        if_absent: bool = False,
        expected_updated_at: int | None = None,
    ) -> bool:
        return await self._inner.put_schedule(
            record, if_absent=if_absent, expected_updated_at=expected_updated_at
        )

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        return await self._inner.get_schedule(schedule_id)

    async def delete_schedule(self, schedule_id: str) -> bool:
        return await self._inner.delete_schedule(schedule_id)

    async def list_schedules(self, query: ScheduleQuery) -> list[ScheduleRecord]:
        return await self._inner.list_schedules(query)


class TestDelegatingStore(StateStoreSuite):
    @asynccontextmanager
    async def open_store(self, clock: StoreClock) -> AsyncIterator[StateStore]:
        store = DelegatingStore(clock)
        await store.ensure_schema()
        try:
            yield store
        finally:
            await store.close()


def test_the_wrapper_is_a_whole_store_of_its_own() -> None:
    """The suite above proves the contract, not durably's classes: the wrapper implements
    every method itself and inherits from nothing of durably's."""
    assert missing_store_methods(DelegatingStore) == []
    assert DelegatingStore.__mro__ == (DelegatingStore, object)
