"""The store as a run's turn sees it: `GuardedStore`, every store failure a `StoreFailure`.

A failure of the store inside a turn (a lost connection, a timeout, a constraint the
database refused) ends the turn: it is not the workflow body's to catch, so it surfaces as
`StoreFailure`, which the body's `except Exception` does not swallow as its own error. A
`SerializationError` (the body handed over a value that is not JSON) is the body's, and a
cancellation is the task's: both pass through unchanged.

`RunSideStore` names the roles a turn calls (runs, checkpoints, signals, events, and the
reads of its children); the guard implements each of their methods by an explicit forward,
so the type checker checks every store call of a run against the contract.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import ParamSpec, Protocol, TypeVar

from durably._core.aggregates import CheckpointQuery, CheckpointStat
from durably._core.buffered_signals import BufferScope
from durably._core.errors import SerializationError, StoreFailure
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
from durably._core.run_activity import ActivityBucket, ActivityWindow
from durably._core.run_facets import (
    LeaseOwnerRow,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
)
from durably._store.protocol import (
    CheckpointStore,
    EventStore,
    Payload,
    ReadStore,
    RunStore,
    SignalStore,
)

__all__ = ["GuardedStore", "RunSideStore"]

P = ParamSpec("P")
T = TypeVar("T")


class RunSideStore(RunStore, CheckpointStore, SignalStore, EventStore, ReadStore, Protocol):
    """The roles of the store a run's turn uses (`Execution.store`)."""


async def _guarded(call: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    try:
        return await call(*args, **kwargs)
    except (SerializationError, asyncio.CancelledError):
        raise
    except Exception as exc:
        raise StoreFailure(exc) from exc


class GuardedStore:
    """`store` with its failures raised as `StoreFailure` (see the module docstring)."""

    __slots__ = ("_store",)

    def __init__(self, store: RunSideStore) -> None:
        self._store = store

    # --- RunStore
    async def create_run(self, run: WorkflowRun) -> None:
        await _guarded(self._store.create_run, run)

    async def create_runs(self, runs: Sequence[WorkflowRun]) -> list[str | None]:
        return await _guarded(self._store.create_runs, runs)

    async def update_run(self, run_id: str, patch: RunPatch) -> None:
        await _guarded(self._store.update_run, run_id, patch)

    async def update_run_if_status(
        self, run_id: str, patch: RunPatch, statuses: Sequence[RunStatus]
    ) -> bool:
        return await _guarded(self._store.update_run_if_status, run_id, patch, statuses)

    async def get_run(self, run_id: str) -> WorkflowRun | None:
        return await _guarded(self._store.get_run, run_id)

    async def delete_run(self, run_id: str) -> None:
        await _guarded(self._store.delete_run, run_id)

    # --- CheckpointStore
    async def get_checkpoint(self, run_id: str, seq: int) -> StepCheckpoint | None:
        return await _guarded(self._store.get_checkpoint, run_id, seq)

    async def save_checkpoint(self, cp: StepCheckpoint) -> None:
        await _guarded(self._store.save_checkpoint, cp)

    async def save_checkpoint_if_pending(self, cp: StepCheckpoint) -> bool:
        return await _guarded(self._store.save_checkpoint_if_pending, cp)

    async def save_checkpoints(self, cps: Sequence[StepCheckpoint]) -> None:
        await _guarded(self._store.save_checkpoints, cps)

    async def save_checkpoints_if_pending(self, cps: Sequence[StepCheckpoint]) -> list[bool]:
        return await _guarded(self._store.save_checkpoints_if_pending, cps)

    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]:
        return await _guarded(self._store.list_checkpoints, run_id)

    async def get_latest_checkpoint_by_name(self, run_id: str, name: str) -> StepCheckpoint | None:
        return await _guarded(self._store.get_latest_checkpoint_by_name, run_id, name)

    async def list_checkpoints_by_name_prefix(
        self, run_id: str, prefixes: Sequence[str]
    ) -> list[StepCheckpoint]:
        return await _guarded(self._store.list_checkpoints_by_name_prefix, run_id, prefixes)

    async def count_checkpoints(
        self, run_id: str, from_seq: int, to_seq: int, statuses: Sequence[str]
    ) -> int:
        return await _guarded(self._store.count_checkpoints, run_id, from_seq, to_seq, statuses)

    async def fold_checkpoints(
        self, run_id: str, first_seq: int, last_seq: int, cp: StepCheckpoint
    ) -> None:
        await _guarded(self._store.fold_checkpoints, run_id, first_seq, last_seq, cp)

    # --- SignalStore
    async def put_signal_waiter(self, waiter: SignalWaiter) -> None:
        await _guarded(self._store.put_signal_waiter, waiter)

    async def list_signal_waiters(self, prefix: str) -> list[SignalWaiter]:
        return await _guarded(self._store.list_signal_waiters, prefix)

    async def remove_signal_waiter(self, waiter: SignalWaiter) -> None:
        await _guarded(self._store.remove_signal_waiter, waiter)

    async def register_child_waits(self, waits: Sequence[ChildWait]) -> None:
        await _guarded(self._store.register_child_waits, waits)

    async def deliver_signals(
        self, payloads: Sequence[tuple[str, Payload]], at: datetime
    ) -> list[StepCheckpoint]:
        return await _guarded(self._store.deliver_signals, payloads, at)

    async def buffer_signal(self, token: str, payload: Payload) -> None:
        await _guarded(self._store.buffer_signal, token, payload)

    async def peek_buffered_signals(self, token: str, limit: int) -> list[BufferedSignal]:
        return await _guarded(self._store.peek_buffered_signals, token, limit)

    async def take_buffered_signal_into(
        self, token: str, cp: StepCheckpoint, *, waiting: bool = False
    ) -> BufferedSignal | None:
        return await _guarded(self._store.take_buffered_signal_into, token, cp, waiting=waiting)

    async def deliver_buffered_signal(self, token: str, at: datetime) -> StepCheckpoint | None:
        return await _guarded(self._store.deliver_buffered_signal, token, at)

    async def buffer_signal_bounded(
        self, token: str, payload: Payload, *, ttl_ms: int, per_token: int, per_namespace: int
    ) -> BufferScope | None:
        return await _guarded(
            self._store.buffer_signal_bounded,
            token,
            payload,
            ttl_ms=ttl_ms,
            per_token=per_token,
            per_namespace=per_namespace,
        )

    # --- EventStore
    async def buffer_event(self, event: BufferedEvent) -> None:
        await _guarded(self._store.buffer_event, event)

    async def buffer_event_bounded(
        self, event: BufferedEvent, *, ttl_ms: int, per_name: int, per_namespace: int
    ) -> BufferScope | None:
        return await _guarded(
            self._store.buffer_event_bounded,
            event,
            ttl_ms=ttl_ms,
            per_name=per_name,
            per_namespace=per_namespace,
        )

    async def purge_expired_events(self, published_before_ms: int) -> int:
        return await _guarded(self._store.purge_expired_events, published_before_ms)

    async def list_buffered_events(self, name: str, limit: int) -> list[BufferedEvent]:
        return await _guarded(self._store.list_buffered_events, name, limit)

    async def remove_buffered_event(self, event_id: str) -> bool:
        return await _guarded(self._store.remove_buffered_event, event_id)

    async def take_buffered_event_into(self, event_id: str, token: str, cp: StepCheckpoint) -> bool:
        return await _guarded(self._store.take_buffered_event_into, event_id, token, cp)

    async def deliver_buffered_event(
        self, event_id: str, token: str, at: datetime
    ) -> StepCheckpoint | None:
        return await _guarded(self._store.deliver_buffered_event, event_id, token, at)

    # --- ReadStore
    async def list_runs(self, query: RunQuery) -> list[WorkflowRun]:
        return await _guarded(self._store.list_runs, query)

    async def count_runs(self, query: RunQuery) -> int:
        return await _guarded(self._store.count_runs, query)

    async def run_facets(self, query: RunQuery) -> list[RunFacetRow]:
        return await _guarded(self._store.run_facets, query)

    async def run_value_facets(
        self, axis: RunValueAxis, query: RunQuery, opts: RunValueFacetOptions | None = None
    ) -> list[RunValueFacetRow]:
        return await _guarded(self._store.run_value_facets, axis, query, opts)

    async def run_activity(self, query: RunQuery, window: ActivityWindow) -> list[ActivityBucket]:
        return await _guarded(self._store.run_activity, query, window)

    async def lease_owners(self, now_ms: int, namespace: str | None = None) -> list[LeaseOwnerRow]:
        return await _guarded(self._store.lease_owners, now_ms, namespace)

    async def checkpoint_stats(self, run_id: str, group: str | None = None) -> list[CheckpointStat]:
        return await _guarded(self._store.checkpoint_stats, run_id, group)

    async def query_checkpoints(self, run_id: str, query: CheckpointQuery) -> list[StepCheckpoint]:
        return await _guarded(self._store.query_checkpoints, run_id, query)
