"""InMemoryStateStore: the reference StateStore.

Everything lives in plain dicts (`memory_tables.MemoryTables`). Every method body runs
without an `await`, so each call is atomic with respect to other asyncio tasks:
compare-and-set, take-once and lease semantics need no lock.

Parity with the SQL stores is deliberate, so that tests written against this
store hold for the others. What is stored and what is read back is decided in
`memory_rows.py` (strict-JSON payloads, millisecond UTC datetimes, `namespace=None` written
as `'default'`, a fresh copy on every read); a missing run in `update_run` is a no-op.

The store is assembled from part objects, each in a module of its own: checkpoint aggregates
(`memory_aggregates.py`), run facets (`memory_facets.py`), start admission
(`memory_quota.py`) and the signal buffer (`memory_signals.py`). The store makes one
`MemoryTables` (the rows, the attribute index, the clock, the test counters), hands it to
each part with whichever of its own contract methods the part writes through, and forwards
those contract methods to the parts in one line each. No part sees the store itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from durably._core.aggregates import CheckpointQuery, CheckpointStat
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
    delivered_signal,
    now_utc,
)
from durably._core.quota import StartGate, StartOutcome
from durably._core.retention import RetentionPolicy, select_prunable
from durably._core.run_activity import ActivityBucket, ActivityWindow
from durably._core.run_facets import (
    LeaseOwnerRow,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
)
from durably._core.schedules import ScheduleQuery, ScheduleRecord
from durably._core.worker_beats import ALL_NAMESPACES, WorkerBeat, beat_from_row, beat_info_json
from durably._store.derived import DerivedStoreMethods
from durably._store.memory_aggregates import MemoryCheckpointAggregates
from durably._store.memory_facets import MemoryRunFacets
from durably._store.memory_quota import MemoryStartAdmission
from durably._store.memory_rows import (
    at_ms,
    clone,
    norm_checkpoint,
    norm_patch_value,
    norm_run,
    read_checkpoint,
    read_run,
    to_json,
)
from durably._store.memory_schedules import MemorySchedules
from durably._store.memory_signals import MemorySignalBuffer
from durably._store.memory_tables import MemoryTables
from durably._store.protocol import WakeHandler
from durably._store.query import (
    namespace_matches,
    newest_first,
    page,
    pickup_order,
)

_INCOMPLETE_STATUSES = frozenset({"running", "cancelling"})
_PATCH_KEYS: frozenset[str] = frozenset(RunPatch.__optional_keys__) | frozenset(
    RunPatch.__required_keys__
)


# ------------------------------------------------------------------ the store


class InMemoryStateStore(DerivedStoreMethods):
    """The reference StateStore: what every other store must answer.

    Test hooks: `last_attribute_candidates`, `last_checkpoint_rows_read`,
    `checkpoint_rows_read`, `checkpoint_stats_rows_read` and `statement_count` (one per
    method call), read from the store's `MemoryTables`.
    """

    def __init__(self, *, clock: Callable[[], datetime] | None = None) -> None:
        self._clock: Callable[[], datetime] = clock or now_utc
        self._tables = tables = MemoryTables(self._clock)
        self._aggregates = MemoryCheckpointAggregates(tables)
        self._facets = MemoryRunFacets(tables)
        self._admission = MemoryStartAdmission(tables, self.create_run)
        self._signal_buffer = MemorySignalBuffer(
            tables, save_checkpoint=self.save_checkpoint, buffer_event=self.buffer_event
        )
        self._wake_handlers: list[WakeHandler] = []
        self._instance_holds: set[str] = set()
        # (namespace, instance_id) -> (beat_at, started_at, info JSON text)
        self._beats: dict[tuple[str, str], tuple[int, int, str]] = {}
        self._schedules = MemorySchedules(tables)

    # ------------------------------------------------------------------ test hooks

    @property
    def statement_count(self) -> int:
        return self._tables.statement_count

    @property
    def last_attribute_candidates(self) -> int:
        return self._tables.last_attribute_candidates

    @property
    def last_checkpoint_rows_read(self) -> int:
        return self._tables.last_checkpoint_rows_read

    @property
    def checkpoint_rows_read(self) -> int:
        return self._tables.checkpoint_rows_read

    @property
    def checkpoint_stats_rows_read(self) -> int:
        return self._tables.checkpoint_stats_rows_read

    # ------------------------------------------------------------------ lifecycle

    async def ensure_schema(self) -> None:
        """Nothing to create: the dicts exist from construction."""

    async def close(self) -> None:
        """Nothing to release; the rows stay readable (an engine may close a store it was
        handed while the test that made it still inspects it)."""

    # ------------------------------------------------------------------ runs

    async def create_run(self, run: WorkflowRun) -> None:
        self._tables.tick()
        if run.id in self._tables.runs:
            raise ValueError(f"run {run.id} already exists")
        stored = norm_run(run)
        self._tables.runs[run.id] = stored
        self._tables.index_attributes(run.id, stored.search_attributes)

    async def update_run(self, run_id: str, patch: RunPatch) -> None:
        """Presence-based patch: a key absent from `patch` is left alone, a key set to None
        clears the field."""
        self._tables.tick()
        self._patch_run(run_id, patch)

    def _patch_run(self, run_id: str, patch: RunPatch) -> None:
        unknown = set(patch) - _PATCH_KEYS
        if unknown:
            raise ValueError(f"unknown RunPatch key(s): {sorted(unknown)}")
        changes: dict[str, Any] = {}
        for key, value in patch.items():
            if key in ("created_at", "updated_at") and value is None:
                continue  # written only when non-None
            changes[key] = norm_patch_value(run_id, key, value)
        if not changes:
            return  # an empty effective patch issues no UPDATE
        current = self._tables.runs.get(run_id)
        if current is None:
            return  # durably: a missing run is a no-op, like the SQL stores
        if "updated_at" not in changes:
            changes["updated_at"] = at_ms(self._clock())
        self._tables.runs[run_id] = dataclasses.replace(current, **changes)
        if "search_attributes" in changes:
            self._tables.unindex_attributes(current)
            self._tables.index_attributes(run_id, changes["search_attributes"])

    async def update_run_if_status(
        self, run_id: str, patch: RunPatch, statuses: Sequence[RunStatus]
    ) -> bool:
        """`update_run` only while the run's status is one of `statuses`."""
        self._tables.tick()
        current = self._tables.runs.get(run_id)
        if current is None or current.status not in statuses:
            return False
        self._patch_run(run_id, patch)
        return True

    async def get_run(self, run_id: str) -> WorkflowRun | None:
        self._tables.tick()
        run = self._tables.runs.get(run_id)
        return read_run(run) if run is not None else None

    async def delete_run(self, run_id: str) -> None:
        """Deletes the run, its checkpoints, waiters and attribute rows (not buffers)."""
        self._tables.tick()
        run = self._tables.runs.pop(run_id, None)
        if run is not None:
            self._tables.unindex_attributes(run)
        self._tables.checkpoints.pop(run_id, None)
        for token in [t for t, w in self._tables.waiters.items() if w.run_id == run_id]:
            del self._tables.waiters[token]

    async def prune_terminal_runs(
        self, policy: RetentionPolicy, now_ms: int, limit: int, *, dry_run: bool = False
    ) -> list[str]:
        """The reference selection of `RetentionPolicy` (see `durably._core.retention`):
        up to `limit` ids, oldest first, deleted like `delete_run` unless `dry_run`."""
        self._tables.tick()
        ids = select_prunable(self._tables.runs.values(), policy, now_ms, limit)
        if not dry_run:
            for run_id in ids:
                await self.delete_run(run_id)
        return ids

    # ------------------------------------------------------------------ checkpoints

    async def get_checkpoint(self, run_id: str, seq: int) -> StepCheckpoint | None:
        self._tables.tick()
        cp = self._tables.checkpoints.get(run_id, {}).get(seq)
        if cp is None:
            return None
        self._tables.rows_read(1, last=False)  # durably: counted, but not a "last" listing read
        return read_checkpoint(cp)

    async def save_checkpoint(self, cp: StepCheckpoint) -> None:
        """Upsert on (run_id, seq): the whole row is replaced."""
        self._tables.tick()
        stored = norm_checkpoint(cp)
        self._tables.checkpoints.setdefault(cp.run_id, {})[cp.seq] = stored

    async def save_checkpoints(self, cps: Sequence[StepCheckpoint]) -> None:
        """Upsert every row; all or nothing (every row is checked before any is stored)."""
        self._tables.tick()
        staged = [norm_checkpoint(cp) for cp in cps]
        for row in staged:
            self._tables.checkpoints.setdefault(row.run_id, {})[row.seq] = row

    async def save_checkpoints_if_pending(self, cps: Sequence[StepCheckpoint]) -> list[bool]:
        """Batched CAS: per-entry results in order, all-or-nothing on failure."""
        self._tables.tick()
        if not cps:
            return []
        # Validate every entry before touching storage: if anything raises, nothing is written.
        staged_rows = [norm_checkpoint(cp) for cp in cps]
        staged: dict[tuple[str, int], StepCheckpoint] = {}
        results: list[bool] = []
        for row in staged_rows:
            key = (row.run_id, row.seq)
            current = (
                staged[key]
                if key in staged
                else self._tables.checkpoints.get(row.run_id, {}).get(row.seq)
            )
            won = current is not None and current.status == "pending"
            if won:
                staged[key] = row  # a later entry for the same key sees this write
            results.append(won)
        for (run_id, seq), row in staged.items():
            self._tables.checkpoints.setdefault(run_id, {})[seq] = row
        return results

    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]:
        self._tables.tick()
        rows = self._tables.run_checkpoints(run_id)
        self._tables.rows_read(len(rows))
        return [read_checkpoint(cp) for cp in rows]

    async def get_latest_checkpoint_by_name(self, run_id: str, name: str) -> StepCheckpoint | None:
        self._tables.tick()
        best: StepCheckpoint | None = None
        for cp in self._tables.checkpoints.get(run_id, {}).values():
            if cp.name == name and (best is None or cp.seq > best.seq):
                best = cp
        self._tables.rows_read(0 if best is None else 1)
        return read_checkpoint(best) if best is not None else None

    async def count_checkpoints(
        self, run_id: str, from_seq: int, to_seq: int, statuses: Sequence[str]
    ) -> int:
        """Rows with `from_seq <= seq <= to_seq` (both inclusive) and a listed status."""
        self._tables.tick()
        if not statuses:
            return 0
        wanted = set(statuses)
        return sum(
            1
            for seq, cp in self._tables.checkpoints.get(run_id, {}).items()
            if from_seq <= seq <= to_seq and cp.status in wanted
        )

    # --- aggregates: memory_aggregates.MemoryCheckpointAggregates

    async def checkpoint_stats(self, run_id: str, group: str | None = None) -> list[CheckpointStat]:
        """One bucket per `(parallelGroup, status, nameKind)` , ordered by
        `min_seq`; only `group`'s checkpoints when given."""
        return await self._aggregates.checkpoint_stats(run_id, group)

    async def query_checkpoints(
        self, run_id: str, query: CheckpointQuery | Mapping[str, Any] | None = None
    ) -> list[StepCheckpoint]:
        """The run's checkpoints matching `query`, by seq, then `offset`/`limit` (a
        `CheckpointQuery`, or its camelCase JSON mapping)."""
        return await self._aggregates.query_checkpoints(run_id, query)

    # ------------------------------------------------------------------ pick-up scans

    async def list_incomplete_runs(self, namespace: str | None = None) -> list[WorkflowRun]:
        self._tables.tick()
        rows = [
            r
            for r in self._tables.runs.values()
            if r.status in _INCOMPLETE_STATUSES and namespace_matches(r.namespace, namespace)
        ]
        rows.sort(key=lambda r: (r.created_at, r.id))  # no order is promised; be stable
        return [read_run(r) for r in rows]

    async def list_due_timers(
        self, now_ms: int, namespace: str | None = None, limit: int | None = None
    ) -> list[WorkflowRun]:
        """Suspended and blocked runs with `wake_at <= now_ms`, ordered by (wake_at, id)."""
        self._tables.tick()
        rows = [
            r
            for r in self._tables.runs.values()
            if r.status in ("suspended", "blocked")
            and r.wake_at is not None
            and r.wake_at <= now_ms
            and namespace_matches(r.namespace, namespace)
        ]
        rows.sort(key=lambda r: (r.wake_at or 0, r.id))
        if limit is not None:
            rows = rows[: max(limit, 0)]
        return [read_run(r) for r in rows]

    async def list_orphaned_suspended(
        self, now_ms: int, namespace: str | None = None, limit: int = 100
    ) -> list[WorkflowRun]:
        """Suspended runs whose owner's lease lapsed."""
        self._tables.tick()
        rows = [
            r
            for r in self._tables.runs.values()
            if r.status == "suspended"
            and r.locked_by is not None
            and r.locked_until is not None
            and r.locked_until <= now_ms
            and namespace_matches(r.namespace, namespace)
        ]
        rows.sort(key=lambda r: (r.locked_until or 0, r.id))
        return [read_run(r) for r in rows[: max(limit, 0)]]

    # ------------------------------------------------------------------ leases

    def _try_lock(self, run_id: str, owner: str, lease_until_ms: int, now_ms: int) -> bool:
        run = self._tables.runs.get(run_id)
        if run is None:
            return False
        # Boundary inclusive: `locked_until == now_ms` is expired and can be taken by anyone.
        if run.locked_until is not None and run.locked_until > now_ms:
            return False
        self._tables.runs[run_id] = dataclasses.replace(
            run, locked_by=owner, locked_until=lease_until_ms
        )
        return True

    async def release_run_lock(self, run_id: str) -> None:
        self._tables.tick()
        run = self._tables.runs.get(run_id)
        if run is not None:
            self._tables.runs[run_id] = dataclasses.replace(run, locked_by=None, locked_until=None)

    # --- leases in bulk: one call per engine instance, not per run

    async def renew_run_locks(self, owner: str, lease_until_ms: int) -> int:
        self._tables.tick()
        count = 0
        for run_id, run in self._tables.runs.items():
            if run.locked_by == owner:
                self._tables.runs[run_id] = dataclasses.replace(run, locked_until=lease_until_ms)
                count += 1
        return count

    async def release_locks_of(self, owner: str) -> int:
        self._tables.tick()
        count = 0
        for run_id, run in self._tables.runs.items():
            if run.locked_by == owner:
                self._tables.runs[run_id] = dataclasses.replace(
                    run, locked_by=None, locked_until=None
                )
                count += 1
        return count

    async def claim_run(
        self, run_id: str, owner: str, lease_until_ms: int, now_ms: int
    ) -> WorkflowRun | None:
        self._tables.tick()
        if not self._try_lock(run_id, owner, lease_until_ms, now_ms):
            return None
        return read_run(self._tables.runs[run_id])

    async def claim_pending_runs(
        self,
        owner: str,
        lease_until_ms: int,
        now_ms: int,
        limit: int,
        namespace: str | None = None,
    ) -> list[WorkflowRun]:
        """Lease up to `limit` pending runs, higher priority first, then oldest."""
        self._tables.tick()
        rows = [
            r
            for r in self._tables.runs.values()
            if r.status == "pending"
            and namespace_matches(r.namespace, namespace)
            and (r.locked_until is None or r.locked_until <= now_ms)
        ]
        rows.sort(key=pickup_order)
        claimed = []
        for row in rows[: max(limit, 0)]:
            self._try_lock(row.id, owner, lease_until_ms, now_ms)
            claimed.append(read_run(self._tables.runs[row.id]))
        return claimed

    async def claim_runs(
        self, ids: Sequence[str], owner: str, lease_until_ms: int, now_ms: int
    ) -> list[WorkflowRun]:
        """Lease the listed runs still `pending`."""
        self._tables.tick_chunks(len(ids))
        claimed = []
        for run_id in dict.fromkeys(ids):
            row = self._tables.runs.get(run_id)
            if row is not None and row.status == "pending":
                if self._try_lock(run_id, owner, lease_until_ms, now_ms):
                    claimed.append(read_run(self._tables.runs[run_id]))
        return claimed

    async def hold_instance(self, instance_id: str) -> _MemoryHold | None:
        """One live engine per `instance_id` on this store."""
        if instance_id in self._instance_holds:
            return None
        self._instance_holds.add(instance_id)
        return _MemoryHold(self._instance_holds, instance_id)

    def wake_bus(self) -> InMemoryWakeBus:
        """Wake-ups between engines that share THIS store object:
        the in-process analogue of PostgreSQL's LISTEN/NOTIFY."""
        return InMemoryWakeBus(self._wake_handlers)

    # ------------------------------------------------------------------ waiters

    async def put_signal_waiter(self, waiter: SignalWaiter) -> None:
        """Upsert by token: a later put for the same token replaces the row."""
        self._tables.tick()
        self._tables.waiters[waiter.token] = waiter

    # ------------------------------------------------------------------ bulk (fans)
    # The multi-row contracts of `_store/sql/bulk.py`; one "statement" per chunk of
    # BULK_CHUNK entries, as the SQL store counts them.

    async def register_child_waits(self, waits: Sequence[ChildWait]) -> None:
        if not waits:
            return
        self._tables.tick_chunks(len(waits))
        for wait in waits:
            self._tables.waiters[wait.waiter.token] = wait.waiter
            if wait.placeholder is not None:
                rows = self._tables.checkpoints.setdefault(wait.placeholder.run_id, {})
                rows.setdefault(wait.placeholder.seq, norm_checkpoint(wait.placeholder))

    async def create_runs(self, new_runs: Sequence[WorkflowRun]) -> list[str | None]:
        if not new_runs:
            return []
        self._tables.tick_chunks(len(new_runs))
        out: list[str | None] = []
        for run in new_runs:
            existing = self._tables.runs.get(run.id)
            if existing is not None:
                out.append(existing.workflow)
                continue
            stored = norm_run(run)
            self._tables.runs[run.id] = stored
            self._tables.index_attributes(run.id, stored.search_attributes)
            out.append(None)
        return out

    async def deliver_signals(
        self, payloads: Sequence[tuple[str, JSONValue]], at: datetime
    ) -> list[StepCheckpoint]:
        if not payloads:
            return []
        by_token = dict(payloads)
        self._tables.tick_chunks(len(by_token))
        written: list[StepCheckpoint] = []
        for token, payload in by_token.items():
            waiter = self._tables.waiters.pop(token, None)
            if waiter is not None:
                cp = delivered_signal(waiter, payload, at)
                self._tables.checkpoints.setdefault(cp.run_id, {})[cp.seq] = norm_checkpoint(cp)
                written.append(cp)
        return written

    async def fold_checkpoints(
        self, run_id: str, first_seq: int, last_seq: int, cp: StepCheckpoint
    ) -> None:
        self._tables.tick()
        rows = self._tables.checkpoints.setdefault(run_id, {})
        for seq in [s for s in rows if first_seq <= s <= last_seq]:
            del rows[seq]
        rows[cp.seq] = norm_checkpoint(cp)

    async def list_signal_waiters(self, prefix: str) -> list[SignalWaiter]:
        """Tokens starting with `prefix` (exact, case-sensitive), by (run_id, seq, token)."""
        self._tables.tick()
        rows = [w for t, w in self._tables.waiters.items() if t.startswith(prefix)]
        rows.sort(key=lambda w: (w.run_id, w.seq, w.token))
        return rows

    async def remove_signal_waiter(self, waiter: SignalWaiter) -> None:
        """Deletes only the row matching token AND run_id AND seq."""
        self._tables.tick()
        current = self._tables.waiters.get(waiter.token)
        if current is not None and current.run_id == waiter.run_id and current.seq == waiter.seq:
            del self._tables.waiters[waiter.token]

    # ------------------------------------------------------------------ buffers
    # Buffered signals and bounded events: memory_signals.MemorySignalBuffer.

    async def buffer_signal(self, token: str, payload: JSONValue) -> None:
        await self._signal_buffer.buffer_signal(token, payload)

    async def buffer_signal_bounded(
        self, token: str, payload: JSONValue, *, ttl_ms: int, per_token: int, per_namespace: int
    ) -> BufferScope | None:
        return await self._signal_buffer.buffer_signal_bounded(
            token, payload, ttl_ms=ttl_ms, per_token=per_token, per_namespace=per_namespace
        )

    async def peek_buffered_signals(self, token: str, limit: int) -> list[BufferedSignal]:
        return await self._signal_buffer.peek_buffered_signals(token, limit)

    async def take_buffered_signal_into(
        self, token: str, cp: StepCheckpoint, *, waiting: bool = False
    ) -> BufferedSignal | None:
        """The oldest live row of `token` becomes `cp`'s output, in one step."""
        return await self._signal_buffer.take_buffered_signal_into(token, cp, waiting=waiting)

    async def deliver_buffered_signal(self, token: str, at: datetime) -> StepCheckpoint | None:
        """The token's waiter and its oldest live row, taken together into the waiter's
        checkpoint (one step)."""
        return await self._signal_buffer.deliver_buffered_signal(token, at)

    async def buffer_event_bounded(
        self, event: BufferedEvent, *, ttl_ms: int, per_name: int, per_namespace: int
    ) -> BufferScope | None:
        """The caps checked and the event stored in one step: exact. Live: published less
        than `ttl_ms` before this event."""
        return await self._signal_buffer.buffer_event_bounded(
            event, ttl_ms=ttl_ms, per_name=per_name, per_namespace=per_namespace
        )

    async def purge_expired_events(self, published_before_ms: int) -> int:
        return await self._signal_buffer.purge_expired_events(published_before_ms)

    async def take_buffered_event_into(self, event_id: str, token: str, cp: StepCheckpoint) -> bool:
        """The buffered event becomes `cp`'s output and the wait's waiter row goes, in one
        step."""
        return await self._signal_buffer.take_buffered_event_into(event_id, token, cp)

    async def deliver_buffered_event(
        self, event_id: str, token: str, at: datetime
    ) -> StepCheckpoint | None:
        """The token's waiter and the buffered event, taken together into the waiter's
        checkpoint (one step)."""
        return await self._signal_buffer.deliver_buffered_event(event_id, token, at)

    async def list_buffered_signals(
        self, *, prefix: str | None, limit: int, offset: int
    ) -> list[BufferedSignalInfo]:
        return await self._signal_buffer.list_buffered_signals(
            prefix=prefix, limit=limit, offset=offset
        )

    async def count_buffered_signals(self, *, prefix: str | None = None) -> int:
        return await self._signal_buffer.count_buffered_signals(prefix=prefix)

    async def purge_buffered_signals(
        self, *, token: str | None = None, prefix: str | None = None, expired_only: bool = False
    ) -> int:
        return await self._signal_buffer.purge_buffered_signals(
            token=token, prefix=prefix, expired_only=expired_only
        )

    async def buffer_event(self, event: BufferedEvent) -> None:
        self._tables.tick()
        if event.id in self._tables.events:
            raise ValueError(f"buffered event {event.id} already exists")
        self._tables.events[event.id] = dataclasses.replace(event, payload=to_json(event.payload))

    async def list_buffered_events(self, name: str, limit: int) -> list[BufferedEvent]:
        """Oldest `published_at` first (ties by id), at most `limit`, not consuming."""
        self._tables.tick()
        rows = [e for e in self._tables.events.values() if e.name == name]
        rows.sort(key=lambda e: (e.published_at, e.id))
        return [dataclasses.replace(e, payload=clone(e.payload)) for e in rows[: max(limit, 0)]]

    async def remove_buffered_event(self, event_id: str) -> bool:
        self._tables.tick()
        return self._tables.events.pop(event_id, None) is not None

    # ------------------------------------------------------------------ listing

    async def list_runs(self, query: RunQuery) -> list[WorkflowRun]:
        """Matching runs, newest first (created_at DESC, id DESC), then offset/limit."""
        self._tables.tick()
        rows = page(newest_first(self._tables.select(query)), query.offset, query.limit)
        return [read_run(r) for r in rows]

    async def count_runs(self, query: RunQuery) -> int:
        """Number of runs matching `query`; `limit`/`offset` are ignored (0.77)."""
        self._tables.tick()
        return len(self._tables.select(query))

    # --- facets: memory_facets.MemoryRunFacets

    async def run_facets(self, query: RunQuery) -> list[RunFacetRow]:
        """`(status, origin, count)` cells over every run matching `query` minus its
        status/origin predicates and page."""
        return await self._facets.run_facets(query)

    async def run_value_facets(
        self,
        axis: RunValueAxis | Mapping[str, Any] | str,
        query: RunQuery,
        opts: RunValueFacetOptions | Mapping[str, Any] | None = None,
    ) -> list[RunValueFacetRow]:
        """Values of `axis` over the newest `scan` runs matching `query`."""
        return await self._facets.run_value_facets(axis, query, opts)

    async def run_activity(self, query: RunQuery, window: ActivityWindow) -> list[ActivityBucket]:
        """Runs started, completed and failed per bucket of `window` among those matching
        `query` (page ignored)."""
        return await self._facets.run_activity(query, window)

    async def lease_owners(self, now_ms: int, namespace: str | None = None) -> list[LeaseOwnerRow]:
        """Unexpired leases grouped by `(namespace, owner)`."""
        return await self._facets.lease_owners(now_ms, namespace)

    # ------------------------------------------------------------------ start admission
    # memory_quota.MemoryStartAdmission: each call one atomic step.

    async def create_run_gated(self, run: WorkflowRun, gate: StartGate) -> StartOutcome:
        return await self._admission.create_run_gated(run, gate)

    async def gate_untagged_run(
        self, run_id: str, new_tags: Sequence[str], gate: StartGate
    ) -> StartOutcome:
        return await self._admission.gate_untagged_run(run_id, new_tags, gate)

    async def try_admit_singleton(
        self, run_id: str, tag: str, workflow: str, limit: int, retry_wake_at_ms: int
    ) -> bool:
        return await self._admission.try_admit_singleton(
            run_id, tag, workflow, limit, retry_wake_at_ms
        )

    async def wake_singleton_waiters(
        self, tag: str, workflow: str, limit: int, now_ms: int
    ) -> list[str]:
        return await self._admission.wake_singleton_waiters(tag, workflow, limit, now_ms)

    # ------------------------------------------------------------------ worker heartbeats
    # Kept as the SQL store keeps them (the key, the times, the `info` JSON text) and read
    # back through the same bounded reader, so an odd row reads the same on every store.

    async def beat_worker(self, beat: WorkerBeat) -> None:
        self._tables.tick()
        self._beats[(beat.namespace, beat.instance_id)] = (
            beat.beat_at,
            beat.started_at,
            beat_info_json(beat),
        )

    async def list_worker_beats(
        self, namespace: str | None, since_ms: int, limit: int
    ) -> list[WorkerBeat]:
        self._tables.tick()
        rows = sorted(
            (
                (at, ns, iid, started, info)
                for (ns, iid), (at, started, info) in self._beats.items()
                if at >= since_ms and (namespace is None or ns in (namespace, ALL_NAMESPACES))
            ),
            key=lambda row: (-row[0], row[1], row[2]),
        )[: max(limit, 0)]
        found = (beat_from_row(ns, iid, at, started, info) for at, ns, iid, started, info in rows)
        return [beat for beat in found if beat is not None]

    async def forget_worker(self, namespace: str, instance_id: str) -> None:
        self._tables.tick()
        self._beats.pop((namespace, instance_id), None)

    async def prune_worker_beats(self, before_ms: int) -> int:
        self._tables.tick()
        stale = [key for key, (at, _, _) in self._beats.items() if at < before_ms]
        for key in stale:
            del self._beats[key]
        return len(stale)

    # ------------------------------------------------------------------ schedules
    # Forwards to `memory_schedules.MemorySchedules`.

    async def put_schedule(
        self,
        record: ScheduleRecord,
        *,
        if_absent: bool = False,
        expected_updated_at: int | None = None,
    ) -> bool:
        return await self._schedules.put_schedule(
            record, if_absent=if_absent, expected_updated_at=expected_updated_at
        )

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        return await self._schedules.get_schedule(schedule_id)

    async def delete_schedule(self, schedule_id: str) -> bool:
        return await self._schedules.delete_schedule(schedule_id)

    async def list_schedules(self, query: ScheduleQuery) -> list[ScheduleRecord]:
        return await self._schedules.list_schedules(query)


class _MemoryHold:
    def __init__(self, holds: set[str], instance_id: str):
        self._holds = holds
        self._instance_id = instance_id

    async def release(self) -> None:
        self._holds.discard(self._instance_id)


class InMemoryWakeBus:
    """One engine's subscription to the wake messages of engines sharing a memory store."""

    def __init__(self, handlers: list[WakeHandler]):
        self._handlers = handlers
        self._handler: WakeHandler | None = None

    async def start(self, handler: WakeHandler) -> None:
        self._handler = handler
        self._handlers.append(handler)

    async def publish(self, kind: str, run_id: str) -> None:
        loop = asyncio.get_running_loop()
        for handler in tuple(self._handlers):
            loop.call_soon(handler, kind, run_id)  # delivered after the publisher yields

    async def close(self) -> None:
        if self._handler is not None and self._handler in self._handlers:
            self._handlers.remove(self._handler)
        self._handler = None


if TYPE_CHECKING:
    from durably._store.protocol import StateStore, WakeBus

    # mypy proves the reference store implements the whole contract.
    _as_state_store: StateStore = InMemoryStateStore()
    _as_bus: WakeBus = InMemoryWakeBus([])


__all__ = ["InMemoryStateStore", "InMemoryWakeBus"]
