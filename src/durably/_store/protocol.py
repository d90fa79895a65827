"""The StateStore seam (store.md §2–§3).

`StateStore` lists the REQUIRED methods. Optional methods (store.md §2, marked O) are
described by the small protocols below; callers look them up with `getattr(store, name,
None)` so that a store (or a wrapper) that lacks one keeps the absence observable and the
engine takes the documented fallback (store.md §4).

Every first-party store (memory, SQL) also keeps `statement_count`: the number of store
round trips it has served, which the benchmarks divide by the number of steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from durably._core.buffered_signals import BufferedSignalInfo, BufferScope
from durably._core.models import (
    BufferedEvent,
    BufferedSignal,
    ChildWait,
    JSONValue,
    RunPatch,
    RunQuery,
    RunStatus,
    SignalWaiter,
    StepCheckpoint,
    WorkflowRun,
)


class StateStoreUnavailable(RuntimeError):
    """Raised by a store factory when its backing service cannot be reached."""


@runtime_checkable
class StateStore(Protocol):
    """Required store methods. All are coroutines; reads return fresh copies.

    Buffered signals (durably's bounds on store.md §3.7). Every row records its token, its
    namespace (`durably._core.tokens.token_namespace`), when it was buffered and when it
    expires, all in epoch ms of the STORE's clock (so expiry is judged by one clock, whatever
    clock an engine was given):

    - `buffer_signal(token, payload)`: the engine's own completion records (a child's
      completion before its parent joins): no expiry, no cap, never purged.
    - `buffer_signal_bounded(token, payload, ttl_ms=, per_token=, per_namespace=)`: a signal
      from outside, expiring `ttl_ms` after now. Stored only while fewer than `per_token`
      unexpired rows hold the token AND fewer than `per_namespace` unexpired rows share its
      namespace — checked and inserted in ONE statement. Returns None when stored, else the
      scope whose cap refused it (`"token"` checked first) with nothing stored. Concurrency:
      exact on the memory store and SQLite (one writer at a time); on PostgreSQL each
      statement counts the rows committed before it started, so N signals buffering the same
      token or namespace at the same instant can exceed a cap by at most N - 1.
    - `take_buffered_signal(token)`: the oldest UNEXPIRED row of the token; an expired row is
      never returned (it waits for a purge).
    - `list_buffered_signals(prefix=, limit=, offset=)`: `BufferedSignalInfo` rows (token,
      payload size, times — never the payload), tokens starting with `prefix` (exact,
      case-sensitive; None = all), oldest first, expired ones included.
    - `count_buffered_signals(prefix=None)`: how many rows `list_buffered_signals` pages over.
    - `purge_buffered_signals(token=, prefix=, expired_only=)`: delete the rows of `token`
      (exact) or of tokens starting with `prefix` (neither: every row), only the expired ones
      with `expired_only`; rows without expiry (the engine's own) are never deleted. Returns
      the number deleted.
    """

    # --- runs (store.md §3.1)
    async def create_run(self, run: WorkflowRun) -> None: ...
    async def update_run(self, run_id: str, patch: RunPatch) -> None: ...
    async def get_run(self, run_id: str) -> WorkflowRun | None: ...
    async def delete_run(self, run_id: str) -> None: ...

    # --- checkpoints (store.md §3.2)
    async def get_checkpoint(self, run_id: str, seq: int) -> StepCheckpoint | None: ...
    async def save_checkpoint(self, cp: StepCheckpoint) -> None: ...
    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]: ...

    # --- pick-up scans (store.md §3.3)
    async def list_incomplete_runs(self, namespace: str | None = None) -> list[WorkflowRun]: ...
    async def list_pending_runs(
        self, limit: int, namespace: str | None = None
    ) -> list[WorkflowRun]: ...
    async def list_due_timers(
        self, now_ms: int, namespace: str | None = None, limit: int | None = None
    ) -> list[WorkflowRun]: ...

    # --- leases (store.md §3.4)
    async def try_lock_run(
        self, run_id: str, owner: str, lease_until_ms: int, now_ms: int
    ) -> bool: ...
    async def release_run_lock(self, run_id: str) -> None: ...
    async def renew_run_lock(self, run_id: str, owner: str, lease_until_ms: int) -> bool: ...

    # --- signal waiters (store.md §3.5)
    async def put_signal_waiter(self, waiter: SignalWaiter) -> None: ...
    async def take_signal_waiter(self, token: str) -> SignalWaiter | None: ...
    async def list_signal_waiters(self, prefix: str) -> list[SignalWaiter]: ...
    async def remove_signal_waiter(self, waiter: SignalWaiter) -> None: ...

    # --- buffered signals and events (store.md §3.7–3.8)
    async def buffer_signal(self, token: str, payload: JSONValue) -> None: ...
    async def take_buffered_signal(self, token: str) -> BufferedSignal | None: ...
    async def buffer_signal_bounded(
        self, token: str, payload: JSONValue, *, ttl_ms: int, per_token: int, per_namespace: int
    ) -> BufferScope | None: ...
    async def list_buffered_signals(
        self, *, prefix: str | None, limit: int, offset: int
    ) -> list[BufferedSignalInfo]: ...
    async def count_buffered_signals(self, *, prefix: str | None = None) -> int: ...
    async def purge_buffered_signals(
        self, *, token: str | None = None, prefix: str | None = None, expired_only: bool = False
    ) -> int: ...
    async def buffer_event(self, event: BufferedEvent) -> None: ...
    async def list_buffered_events(self, name: str, limit: int) -> list[BufferedEvent]: ...
    async def remove_buffered_event(self, event_id: str) -> bool: ...

    # --- listing (store.md §3.10, §6)
    async def list_runs(self, query: RunQuery) -> list[WorkflowRun]: ...


# ---------------------------------------------------------------- optional (store.md §2 "O")


class SupportsEnsureSchema(Protocol):
    async def ensure_schema(self) -> None: ...


class SupportsClose(Protocol):
    async def close(self) -> None: ...


class SupportsCheckpointCAS(Protocol):
    async def save_checkpoint_if_pending(self, cp: StepCheckpoint) -> bool: ...
    async def save_checkpoints_if_pending(self, cps: Sequence[StepCheckpoint]) -> list[bool]: ...


# Entries per statement of the bulk methods: bounds one bound list / one executemany batch.
BULK_CHUNK = 1000


@runtime_checkable
class SupportsBulkFans(Protocol):
    """(durably) Multi-row operations that make a fan of N members cost O(N / BULK_CHUNK)
    statements (engine.md §3.8, issue #4); the engine falls back to per-row calls without
    them (`_engine/bulk.py`).

    - `register_child_waits(waits)`: store.md §3.6 with `ChildWait = {waiter, placeholder?}`:
      one transaction upserting every waiter and inserting each placeholder whose
      `(run_id, seq)` has no row yet.
    - `create_runs(runs) -> list[str | None]`: insert every run whose id is free, atomically;
      per entry `None` if created, else the workflow name of the run holding the id.
    - `deliver_signals([(token, payload)], at) -> list[StepCheckpoint]`: in one transaction,
      take each token's waiter (if any) and upsert its `signal:<token>` row
      (`models.delivered_signal`); returns the rows written.
    - `fold_checkpoints(run_id, first_seq, last_seq, cp)`: engine.md §3.8.4, in one
      transaction delete the rows of the seq range and write the folded `fan:` row `cp`.
    - `claim_runs(ids, owner, lease_until_ms, now_ms) -> list[WorkflowRun]`: lease the listed
      runs that are `pending` with a free or expired lease (by primary key).
    """

    async def register_child_waits(self, waits: Sequence[ChildWait]) -> None: ...
    async def create_runs(self, runs: Sequence[WorkflowRun]) -> list[str | None]: ...
    async def deliver_signals(
        self, payloads: Sequence[tuple[str, JSONValue]], at: datetime
    ) -> list[StepCheckpoint]: ...
    async def fold_checkpoints(
        self, run_id: str, first_seq: int, last_seq: int, cp: StepCheckpoint
    ) -> None: ...
    async def claim_runs(
        self, ids: Sequence[str], owner: str, lease_until_ms: int, now_ms: int
    ) -> list[WorkflowRun]: ...


class SupportsOrphanScan(Protocol):
    """(durably) `list_orphaned_suspended(now_ms, namespace, limit)`: `suspended` runs whose
    `locked_by` is set but `locked_until <= now_ms` — their bodies were parked in the memory
    of a process that died. Recovery re-drives them at once instead of at their `wakeAt`
    (which, for a signal or child wait, is the reconcile fallback)."""

    async def list_orphaned_suspended(
        self, now_ms: int, namespace: str | None = None, limit: int = 100
    ) -> list[WorkflowRun]: ...


class SupportsCountRuns(Protocol):
    async def count_runs(self, query: RunQuery) -> int: ...


class SupportsCheckpointLookups(Protocol):
    async def get_latest_checkpoint_by_name(
        self, run_id: str, name: str
    ) -> StepCheckpoint | None: ...
    async def list_checkpoints_by_name_prefix(
        self, run_id: str, prefixes: Sequence[str]
    ) -> list[StepCheckpoint]: ...
    async def count_checkpoints(
        self, run_id: str, from_seq: int, to_seq: int, statuses: Sequence[str]
    ) -> int: ...


class SupportsBulkLeases(Protocol):
    """(durably) Lease maintenance in one statement per engine instance, not per run.

    `renew_run_locks(owner, lease_until_ms)` sets `locked_until` on every run whose
    `locked_by == owner` and returns how many rows it touched. `release_locks_of(owner)`
    clears the lease of every run held by `owner` (used at boot by an instance that restarts
    with the same `instance_id`: its previous life's leases are void) and returns the count.
    `claim_run(run_id, owner, lease_until_ms, now_ms)` is `try_lock_run` that returns the
    locked row (one round trip instead of lock + get), or None when not acquired.
    """

    async def renew_run_locks(self, owner: str, lease_until_ms: int) -> int: ...
    async def release_locks_of(self, owner: str) -> int: ...
    async def claim_run(
        self, run_id: str, owner: str, lease_until_ms: int, now_ms: int
    ) -> WorkflowRun | None: ...


class SupportsConditionalUpdate(Protocol):
    """(durably) `update_run` applied only while the run's status is one of `statuses`; one
    conditional UPDATE whose row count is the answer. The engine settles turns through it
    so a run cancelled by another process is never resurrected (engine.md §1.8)."""

    async def update_run_if_status(
        self, run_id: str, patch: RunPatch, statuses: Sequence[RunStatus]
    ) -> bool: ...


WakeHandler = Callable[[str, str], None]
"""`handler(kind, run_id)` for a wake message; called on the event loop, must not block."""


class WakeBus(Protocol):
    """(durably) Cross-process wake-ups between engines sharing one store (issue #3).

    Kinds: `"ready"` — a run became runnable or was nudged (a signal, a child's completion,
    a start by a non-driving engine): whoever holds it wakes it, anyone else may claim it;
    `"settled"` — a run reached a settled status, so waiters in other processes re-read it.
    Delivery is best effort and at-most-once: engines still poll as the fallback, so a lost
    message costs latency, never correctness. `publish` is called after the write it
    announces has committed. A message published by an engine is also delivered to itself.
    """

    async def start(self, handler: WakeHandler) -> None: ...
    async def publish(self, kind: str, run_id: str) -> None: ...
    async def close(self) -> None: ...


class SupportsWakeBus(Protocol):
    def wake_bus(self) -> WakeBus | None: ...


class SupportsClaimPending(Protocol):
    """(durably) Claim up to `limit` pending runs for `owner` in one statement, oldest first
    (store.md §3.3 order and namespace rules), skipping runs another engine is claiming
    (`FOR UPDATE SKIP LOCKED` on PostgreSQL), taking only runs whose lease is free or
    expired (`locked_until IS NULL OR locked_until <= now_ms`), setting `locked_by`/
    `locked_until` and returning the claimed rows."""

    async def claim_pending_runs(
        self,
        owner: str,
        lease_until_ms: int,
        now_ms: int,
        limit: int,
        namespace: str | None = None,
    ) -> list[WorkflowRun]: ...


class InstanceHold(Protocol):
    async def release(self) -> None: ...


class SupportsInstanceHold(Protocol):
    """(durably) One live process per engine `instance_id`.

    `hold_instance(instance_id)` claims the id for the caller's lifetime and returns a hold,
    or None while a LIVE incarnation holds it. The hold must vanish when its holder dies
    (a database session lock, an OS file lock): only then may a successor with the same id
    void the predecessor's leases and take its runs back at once.
    """

    async def hold_instance(self, instance_id: str) -> InstanceHold | None: ...


__all__ = [
    "InstanceHold",
    "StateStore",
    "StateStoreUnavailable",
    "SupportsBulkLeases",
    "SupportsCheckpointCAS",
    "SupportsCheckpointLookups",
    "SupportsClaimPending",
    "SupportsClose",
    "SupportsConditionalUpdate",
    "SupportsCountRuns",
    "SupportsEnsureSchema",
    "SupportsInstanceHold",
    "SupportsWakeBus",
    "WakeBus",
    "WakeHandler",
]


# ---------------------------------------------------------------- checkpoint aggregates (0.79)

from durably._core.aggregates import CheckpointQuery, CheckpointStat  # noqa: E402


@runtime_checkable
class SupportsCheckpointAggregates(Protocol):
    """store.md §3.2 (0.79, optional, paired): a store with one has both, and the read side
    takes its aggregate path (run-detail.md §10) only then (`aggregates_checkpoints`).

    - `checkpoint_stats(run_id, group=None)`: one `CheckpointStat` per distinct
      `(parallelGroup, status, nameKind)` of the run's checkpoints (only `group`'s when
      given), from ONE `GROUP BY` that never reads payload columns. Bucket order unspecified.
    - `query_checkpoints(run_id, query)`: the run's checkpoints matching `query`, ordered by
      seq, then `offset`/`limit`; filtered and paged by the store (in SQL on SQL stores).
    """

    async def checkpoint_stats(
        self, run_id: str, group: str | None = None
    ) -> list[CheckpointStat]: ...
    async def query_checkpoints(
        self, run_id: str, query: CheckpointQuery
    ) -> list[StepCheckpoint]: ...


__all__ += ["SupportsCheckpointAggregates"]


# ---------------------------------------------------------------- run facets (run-detail §4–§6)

from durably._read.list_models import (  # noqa: E402
    LeaseOwnerRow,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
)


@runtime_checkable
class SupportsRunFacets(Protocol):
    """store.md §3.10 (optional): whole-set counts for the console's facets and pickers.

    - `run_facets(query)`: one `RunFacetRow` per `(status, facet_origin(origin))` over every
      run matching `query` with its status/statuses/origin/origins predicates and its page
      dropped (`RunFacetQuery`); zero cells absent. Without it the gateway merges a full
      `list_runs` (`durably._read.lists.run_facets`).
    - `run_value_facets(axis, query, opts=None)`: run-detail.md §5 value counts (column axes
      exact; tag/attribute axes over the newest `opts.scan` runs), merged and limited by
      `merge_run_value_facet_rows`. Without it the gateway answers `[]`.
    """

    async def run_facets(self, query: RunQuery) -> list[RunFacetRow]: ...
    async def run_value_facets(
        self,
        axis: RunValueAxis,
        query: RunQuery,
        opts: RunValueFacetOptions | None = None,
    ) -> list[RunValueFacetRow]: ...


@runtime_checkable
class SupportsLeaseOwners(Protocol):
    """(durably, optional) `lease_owners(now_ms, namespace=None)`: unexpired run leases
    (`locked_until > now_ms`) grouped by `(namespace, locked_by)` — the live engines
    `worker_health` reports without a heartbeat table. Fallback: scan `list_runs`."""

    async def lease_owners(
        self, now_ms: int, namespace: str | None = None
    ) -> list[LeaseOwnerRow]: ...


__all__ += ["SupportsLeaseOwners", "SupportsRunFacets"]
