"""The store contract: `StateStore`, the union of small role protocols every store implements.

The engine and the read side call these methods directly; nothing is looked up with
`getattr` and nothing falls back to a weaker emulation (a read-then-write in place of a
conditional update, a full scan in place of a count). A store that lacks a method is refused
when it is handed to an `Engine` or a `CodecStateStore` (`require_store`), with an error that
names what is missing and the role it belongs to.

The roles. A store implements all of them (`StateStore` inherits every one); each part of the
runtime is typed with the roles it calls (the poller's `PollerStore`, a run's `RunSideStore`,
the read side's `RunListStore`), so its signature says what it needs from a store and a test
can hand it a small fake of just those roles. The contract holds only what the runtime and
the read side call: tests take a buffered signal or a waiter the way the engine does (into a
checkpoint), so no store carries a method for tests alone.

- `StoreLifecycle` (`ensure_schema`, `close`): the engine and the client that own a store
  create its schema at boot and release it at shutdown.
- `RunStore`: the run rows themselves (create, read, patch, the conditional settle write,
  delete). Every side of the runtime reads and writes runs: the control plane starting
  them, a run's turn settling itself, the worker, the operator.
- `CheckpointStore`: the step checkpoints of one run, by key, by name and by seq range,
  written plainly or compare-and-set, and folded. A run's turn (replay, steps, fans, sagas)
  and the worker's settler and mailbox use it.
- `ScanStore`: the pick-up scans that find work without claiming it (incomplete runs to
  recover, due timers, suspended runs orphaned by a dead process): the worker's poller.
- `LeaseStore`: claiming runs, renewing and releasing leases, and holding an engine
  instance id for the life of its process: the poller, the dispatcher (which releases a
  run's lease when its turn ends), remote turns and the worker.
- `WakeSource` (`wake_bus`): the cross-process wake channel, where the store has one: the
  worker's wake listener and the client publishing starts.
- `SignalStore`: signal waiters and the signal buffer as waits and senders use them (put,
  register, deliver, buffer, take into a checkpoint, peek): a run's waits and children, the
  control plane's signal delivery and the operator.
- `BufferedSignalAdmin`: listing, counting and purging the signal buffer without touching
  a run: the client's signal API, the CLI and the dashboard, and the engine's own purges.
- `EventStore`: named events buffered for waits that have not looked yet, bounded, expired
  and taken into checkpoints: event triggers (publish, subscribers) and a run's event waits.
- `ReadStore`: whole-set reads for people (lists, counts, facets, live lease owners,
  checkpoint aggregates and paged checkpoint queries): the read side (`durably._read`), the
  client's reads, the gateway and the dashboard; the poller's sweeps and a parent reading
  its children list runs too.
- `AdmissionStore`: workflow start admission under dedup keys, singletons and quotas, each
  call one transaction: the control plane's starts, the flow-control singleton and the
  worker's first turn of a run started by name.
- `RetentionStore`: pruning finished runs by a retention policy, in bounded batches: the
  engine's retention sweep and `prune`.
- `FleetStore`: the workers' heartbeat rows (`durably._core.worker_beats`): a worker's beat,
  the live rows a start by name or the read side checks, and their removal.
- `ScheduleStore`: persisted schedules (`durably._core.schedules`): the schedule client's
  create, update, list and delete, and the driving engines' due scan and compare-and-set
  advance.

One capability is genuinely optional, and a store declares it by its answer rather than by
the method's absence: `wake_bus()` returns None when the store has no cross-process channel
(SQLite: processes sharing a file rely on the engine's polling).

Methods that every store would implement the same way from other contract methods, with no
extra round trip, are written once in `durably._store.derived` (`DerivedStoreMethods`), which
the first-party stores inherit.

Every first-party store (memory, SQL) also keeps `statement_count`: the number of store
round trips it has served, which the benchmarks divide by the number of steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Annotated, Protocol, cast, runtime_checkable

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

__all__ = [
    "BULK_CHUNK",
    "PAYLOAD",
    "STORE_METHODS",
    "InstanceHold",
    "Payload",
    "PayloadMark",
    "StateStore",
    "StateStoreUnavailable",
    "WakeBus",
    "WakeHandler",
    "missing_store_methods",
    "require_store",
]


class StateStoreUnavailable(RuntimeError):
    """Raised by a store factory when its backing service cannot be reached."""


# Entries per statement of the bulk methods: bounds one bound list / one executemany batch.
BULK_CHUNK = 1000


class PayloadMark:
    """The marker inside `Payload` (one instance, `PAYLOAD`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PAYLOAD"


PAYLOAD = PayloadMark()

Payload = Annotated[JSONValue, PAYLOAD]
"""A user payload passed as a bare JSON value (a signal's payload): the store's data converter
encodes it at rest. Payloads inside the models (run and checkpoint input/output, buffered
signal and event payloads) are named by the converter's field table instead
(`durably._store.converter`); any other JSON value in the contract is refused there, so a
method cannot carry a payload the converter does not know about."""


WakeHandler = Callable[[str, str], None]
"""`handler(kind, run_id)` for a wake message; called on the event loop, must not block."""


class WakeBus(Protocol):
    """Cross-process wake-ups between engines sharing one store.

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


class InstanceHold(Protocol):
    async def release(self) -> None: ...


class StoreLifecycle(Protocol):
    """Creating the schema at boot and releasing the store at shutdown (the owner's)."""

    async def ensure_schema(self) -> None: ...
    async def close(self) -> None: ...


class RunStore(Protocol):
    """The run rows. Reads return fresh copies.

    - `update_run_if_status(run_id, patch, statuses)`: `update_run` applied only while the
      run's status is one of `statuses`, in one conditional statement whose row count is the
      answer. The engine settles turns through it, so a run cancelled by another process is
      never resurrected.
    - `create_runs(runs) -> list[str | None]`: insert every run whose id is free,
      atomically; per entry None if created, else the workflow name of the run holding it
      (O(N / BULK_CHUNK) statements for N runs: a fan's children).
    """

    async def create_run(self, run: WorkflowRun) -> None: ...
    async def create_runs(self, runs: Sequence[WorkflowRun]) -> list[str | None]: ...
    async def update_run(self, run_id: str, patch: RunPatch) -> None: ...
    async def update_run_if_status(
        self, run_id: str, patch: RunPatch, statuses: Sequence[RunStatus]
    ) -> bool: ...
    async def get_run(self, run_id: str) -> WorkflowRun | None: ...
    async def delete_run(self, run_id: str) -> None: ...


class CheckpointStore(Protocol):
    """The step checkpoints of a run, keyed by `(run_id, seq)`.

    - `save_checkpoint_if_pending(cp)` / `save_checkpoints_if_pending(cps)`: write a row only
      while the stored one is still pending (a step finished twice keeps its first result);
      the batch form is atomic and answers per row.
    - `get_latest_checkpoint_by_name`, `list_checkpoints_by_name_prefix` (seq order) and
      `count_checkpoints(run_id, from_seq, to_seq, statuses)` (inclusive range): targeted
      reads, so a replay never lists a whole wide run.
    - `fold_checkpoints(run_id, first_seq, last_seq, cp)`: in one transaction delete the rows
      of the seq range and write the folded `fan:` row `cp`.
    - `save_checkpoints(cps)`: upsert every row (as `save_checkpoint`), atomically, in
      O(N / BULK_CHUNK) statements (the rows a fork copies from its original).
    """

    async def get_checkpoint(self, run_id: str, seq: int) -> StepCheckpoint | None: ...
    async def save_checkpoint(self, cp: StepCheckpoint) -> None: ...
    async def save_checkpoint_if_pending(self, cp: StepCheckpoint) -> bool: ...
    async def save_checkpoints_if_pending(self, cps: Sequence[StepCheckpoint]) -> list[bool]: ...
    async def save_checkpoints(self, cps: Sequence[StepCheckpoint]) -> None: ...
    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]: ...
    async def get_latest_checkpoint_by_name(
        self, run_id: str, name: str
    ) -> StepCheckpoint | None: ...
    async def list_checkpoints_by_name_prefix(
        self, run_id: str, prefixes: Sequence[str]
    ) -> list[StepCheckpoint]: ...
    async def count_checkpoints(
        self, run_id: str, from_seq: int, to_seq: int, statuses: Sequence[str]
    ) -> int: ...
    async def fold_checkpoints(
        self, run_id: str, first_seq: int, last_seq: int, cp: StepCheckpoint
    ) -> None: ...


class ScanStore(Protocol):
    """The pick-up scans: work found without claiming it.

    - `list_orphaned_suspended(now_ms, namespace, limit)`: `suspended` runs whose lease has
      lapsed — their bodies were parked in the memory of a process that died. Recovery
      re-drives them at once instead of at their `wakeAt`.
    """

    async def list_incomplete_runs(self, namespace: str | None = None) -> list[WorkflowRun]: ...
    async def list_due_timers(
        self, now_ms: int, namespace: str | None = None, limit: int | None = None
    ) -> list[WorkflowRun]: ...
    async def list_orphaned_suspended(
        self, now_ms: int, namespace: str | None = None, limit: int = 100
    ) -> list[WorkflowRun]: ...


class LeaseStore(Protocol):
    """Run leases, and one live process per engine instance id.

    - `claim_run(run_id, owner, lease_until_ms, now_ms)`: lease the run when its lease is
      free or expired (`locked_until <= now_ms`) and return the locked row, in one round
      trip; None when not acquired.
    - `claim_runs(ids, owner, lease_until_ms, now_ms)`: lease the listed runs that are
      `pending` with a free or expired lease (by primary key).
    - `claim_pending_runs(owner, lease_until_ms, now_ms, limit, namespace=None)`: claim up to
      `limit` pending runs in pick-up order — higher `priority` first (a run without one
      counts as 0), then oldest (`created_at`, `id`) — in one statement, skipping runs another
      engine is claiming (`FOR UPDATE SKIP LOCKED` on PostgreSQL), taking only free or expired
      leases.
    - `renew_run_locks(owner, lease_until_ms)`: extend every lease `owner` holds, returning
      how many; `release_locks_of(owner)`: clear them all (an instance restarting with the
      same id voids its previous life's leases).
    - `hold_instance(instance_id)`: claim the id for the caller's lifetime and return a hold,
      or None while a LIVE incarnation holds it. The hold vanishes when its holder dies (a
      database session lock, an OS file lock): only then may a successor with the same id
      void the predecessor's leases and take its runs back at once.
    """

    async def release_run_lock(self, run_id: str) -> None: ...
    async def renew_run_locks(self, owner: str, lease_until_ms: int) -> int: ...
    async def release_locks_of(self, owner: str) -> int: ...
    async def claim_run(
        self, run_id: str, owner: str, lease_until_ms: int, now_ms: int
    ) -> WorkflowRun | None: ...
    async def claim_runs(
        self, ids: Sequence[str], owner: str, lease_until_ms: int, now_ms: int
    ) -> list[WorkflowRun]: ...
    async def claim_pending_runs(
        self,
        owner: str,
        lease_until_ms: int,
        now_ms: int,
        limit: int,
        namespace: str | None = None,
    ) -> list[WorkflowRun]: ...
    async def hold_instance(self, instance_id: str) -> InstanceHold | None: ...


class WakeSource(Protocol):
    """`wake_bus()`: a new `WakeBus`, or None when the store has no cross-process channel."""

    def wake_bus(self) -> WakeBus | None: ...


class SignalStore(Protocol):
    """Signal waiters and the signal buffer, as waits and senders use them.

    Waiters (one row per token, pointing at the `(run_id, seq)` that waits):

    - `register_child_waits(waits)`: one transaction upserting every waiter and inserting
      each placeholder whose `(run_id, seq)` has no row yet (O(N / BULK_CHUNK) statements).
    - `deliver_signals([(token, payload)], at)`: in one transaction, take each token's
      waiter (if any) and upsert its `signal:<token>` row; returns the rows written.

    Buffered signals. Every row records its token, its namespace
    (`durably._core.tokens.token_namespace`), when it was buffered and when it expires, all
    in epoch ms of the STORE's clock (so expiry is judged by one clock, whatever clock an
    engine was given):

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
    - `peek_buffered_signals(token, limit)`: the payloads of the token's unexpired rows,
      oldest first, at most `limit`, without taking them (an operator deciding whether a
      child already reported success).
    - `take_buffered_signal_into(token, cp, waiting=False)`: a wait consuming a buffered
      signal. In ONE transaction take the oldest unexpired row of `token` (an expired row is
      never taken: it waits for a purge), save `cp` with the row's payload as its output and
      remove the waiter row of `token` that points at cp's `(run_id, seq)` if there is one;
      return the row. None, and nothing written, when the token has no live row, when the
      row at cp's `(run_id, seq)` is already `completed` (a delivery got there first), or
      with `waiting=True` when that waiter row is gone (a sender took it and is delivering to
      it). Two statements instead would lose the signal to a crash between them: the row
      deleted, no checkpoint holding its payload.
    - `deliver_buffered_signal(token, at)`: a sender that buffered a signal and then finds a
      waiter. In ONE transaction, when `token` has both a waiter and a live row, take both
      and write the waiter's `signal:<token>` checkpoint (`delivered_signal(waiter, payload,
      at)`) with the oldest row's payload; returns that checkpoint. None, and nothing
      changed, when either is missing.
    """

    async def put_signal_waiter(self, waiter: SignalWaiter) -> None: ...
    async def list_signal_waiters(self, prefix: str) -> list[SignalWaiter]: ...
    async def remove_signal_waiter(self, waiter: SignalWaiter) -> None: ...
    async def register_child_waits(self, waits: Sequence[ChildWait]) -> None: ...
    async def deliver_signals(
        self, payloads: Sequence[tuple[str, Payload]], at: datetime
    ) -> list[StepCheckpoint]: ...
    async def buffer_signal(self, token: str, payload: Payload) -> None: ...
    async def peek_buffered_signals(self, token: str, limit: int) -> list[BufferedSignal]: ...
    async def take_buffered_signal_into(
        self, token: str, cp: StepCheckpoint, *, waiting: bool = False
    ) -> BufferedSignal | None: ...
    async def deliver_buffered_signal(self, token: str, at: datetime) -> StepCheckpoint | None: ...
    async def buffer_signal_bounded(
        self, token: str, payload: Payload, *, ttl_ms: int, per_token: int, per_namespace: int
    ) -> BufferScope | None: ...


class BufferedSignalAdmin(Protocol):
    """The signal buffer seen from outside any run (operators, the CLI, the dashboard).

    - `list_buffered_signals(prefix=, limit=, offset=)`: `BufferedSignalInfo` rows (token,
      payload size, times — never the payload), tokens starting with `prefix` (exact,
      case-sensitive; None = all), oldest first, expired ones included.
    - `count_buffered_signals(prefix=None)`: how many rows `list_buffered_signals` pages over.
    - `purge_buffered_signals(token=, prefix=, expired_only=)`: delete the rows of `token`
      (exact) or of tokens starting with `prefix` (neither: every row), only the expired ones
      with `expired_only`; rows without expiry (the engine's own) are never deleted. Returns
      the number deleted.
    """

    async def list_buffered_signals(
        self, *, prefix: str | None, limit: int, offset: int
    ) -> list[BufferedSignalInfo]: ...
    async def count_buffered_signals(self, *, prefix: str | None = None) -> int: ...
    async def purge_buffered_signals(
        self, *, token: str | None = None, prefix: str | None = None, expired_only: bool = False
    ) -> int: ...


class EventStore(Protocol):
    """Named events buffered until a wait takes them.

    - `buffer_event_bounded(event, ttl_ms=, per_name=, per_namespace=)`: `buffer_event`
      unless the event's name already holds `per_name` live events (`"token"`) or all
      events but the engine's accumulator events (names starting `__evtacc__:`) hold
      `per_namespace` (`"namespace"`); refused, nothing is stored. Live: published less
      than `ttl_ms` before `event.published_at`. The check and the insert are one statement.
    - `purge_expired_events(published_before_ms)`: delete the buffered events published at
      or before that time, except accumulator events (never expire); how many.
    - `take_buffered_event_into(event_id, token, cp)`: an event wait (its waiter row on
      `token`, pointing at cp's `(run_id, seq)`, registered before it looked) consuming a
      buffered event. In ONE transaction remove the event, save `cp` with the event's payload
      as its output and remove that waiter row; True. False, and nothing written, when the
      waiter row is gone or points elsewhere (a publisher took it and is delivering to it),
      when the row at cp's `(run_id, seq)` is already `completed`, or when the event is gone
      (another wait took it).
    - `deliver_buffered_event(event_id, token, at)`: a publisher that buffered an event and
      then finds a matching waiter. In ONE transaction, when `token` has a waiter and the
      event is still buffered, take both and write the waiter's `signal:<token>` checkpoint
      (`delivered_signal(waiter, payload, at)`) with the event's payload; returns it. None,
      and nothing changed, when either is missing.
    """

    async def buffer_event(self, event: BufferedEvent) -> None: ...
    async def buffer_event_bounded(
        self, event: BufferedEvent, *, ttl_ms: int, per_name: int, per_namespace: int
    ) -> BufferScope | None: ...
    async def purge_expired_events(self, published_before_ms: int) -> int: ...
    async def list_buffered_events(self, name: str, limit: int) -> list[BufferedEvent]: ...
    async def remove_buffered_event(self, event_id: str) -> bool: ...
    async def take_buffered_event_into(
        self, event_id: str, token: str, cp: StepCheckpoint
    ) -> bool: ...
    async def deliver_buffered_event(
        self, event_id: str, token: str, at: datetime
    ) -> StepCheckpoint | None: ...


class ReadStore(Protocol):
    """Whole-set reads for people: never paged unless the query says so.

    - `count_runs(query)`: how many runs `list_runs(query)` would return.
    - `run_facets(query)`: one `RunFacetRow` per `(status, facet_origin(origin))` over every
      run matching `query` with its status/origin filters and its page dropped
      (`facet_query`: the chips keep their counts while the list is filtered and paged).
    - `run_value_facets(axis, query, opts=None)`: value counts of `axis` (column axes exact;
      tag and attribute axes over the newest `opts.scan` matching runs).
    - `run_activity(query, window)`: runs started / completed / failed per time bucket of
      `window` among the runs matching `query` (page ignored), empty buckets left out
      (`durably._core.run_activity`); at most `window.buckets` rows.
    - `lease_owners(now_ms, namespace=None)`: unexpired run leases grouped by
      `(namespace, locked_by)`: the live engines worker health reports without a heartbeat
      table.
    - `checkpoint_stats(run_id, group=None)`: one `CheckpointStat` per distinct
      `(parallelGroup, status, nameKind)`, from ONE `GROUP BY` that reads no payload column.
      `query_checkpoints(run_id, query)`: the matching checkpoints by seq, then
      `offset`/`limit`, filtered and paged by the store. Together they let the read side
      summarise a wide fan without reading its rows.
    """

    async def list_runs(self, query: RunQuery) -> list[WorkflowRun]: ...
    async def count_runs(self, query: RunQuery) -> int: ...
    async def run_facets(self, query: RunQuery) -> list[RunFacetRow]: ...
    async def run_value_facets(
        self,
        axis: RunValueAxis,
        query: RunQuery,
        opts: RunValueFacetOptions | None = None,
    ) -> list[RunValueFacetRow]: ...
    async def run_activity(
        self, query: RunQuery, window: ActivityWindow
    ) -> list[ActivityBucket]: ...
    async def lease_owners(
        self, now_ms: int, namespace: str | None = None
    ) -> list[LeaseOwnerRow]: ...
    async def checkpoint_stats(
        self, run_id: str, group: str | None = None
    ) -> list[CheckpointStat]: ...
    async def query_checkpoints(
        self, run_id: str, query: CheckpointQuery
    ) -> list[StepCheckpoint]: ...


class AdmissionStore(Protocol):
    """Workflow start admission (`durably._core.quota`), each call ONE transaction
    (PostgreSQL: serialised per key by a transaction-scoped advisory lock; SQLite: one writer
    at a time).

    - `create_run_gated(run, gate) -> StartOutcome`: `create_run` unless the id exists
      (`exists`), a live run holds the gate's dedup key (`duplicate`), the singleton key is
      at capacity (`singleton_full`) or the quota key is full (`quota_full`); the checks
      and the insert cannot be separated by another start of the same keys.
    - `gate_untagged_run(run_id, new_tags, gate) -> StartOutcome`: the same capacity checks
      for a `pending` run created without its keys' tags (started by name where the
      workflow's code is not loaded), at its first turn: `singleton_full`/`quota_full`, or
      `created` with `new_tags` added to the run; `exists` (nothing written) when the run is
      gone or no longer pending. The run itself is not counted (it lacks the tags).
    - `try_admit_singleton(run_id, tag, workflow, limit, retry_wake_at_ms) -> bool`: admit
      the active run to the key's `limit` slots (`durably._core.quota.singleton_admits`):
      the run gets `tag` if it lacks it and, admitted, the admission marker; denied, a run
      not being cancelled is written `suspended` with `wake_at = retry_wake_at_ms` and its
      lease dropped, in the same transaction (a run cancelled meanwhile is never revived).
    - `wake_singleton_waiters(tag, workflow, limit, now_ms) -> list[str]`: the key's
      waiters whose turn it is (`singleton_line`); the suspended ones get `wake_at = now_ms`.
    """

    async def create_run_gated(self, run: WorkflowRun, gate: StartGate) -> StartOutcome: ...
    async def gate_untagged_run(
        self, run_id: str, new_tags: Sequence[str], gate: StartGate
    ) -> StartOutcome: ...
    async def try_admit_singleton(
        self, run_id: str, tag: str, workflow: str, limit: int, retry_wake_at_ms: int
    ) -> bool: ...
    async def wake_singleton_waiters(
        self, tag: str, workflow: str, limit: int, now_ms: int
    ) -> list[str]: ...


class FleetStore(Protocol):
    """The workers' heartbeat rows, one per `(namespace, instance_id)`.

    - `beat_worker(beat)`: upsert the worker's row (one statement).
    - `list_worker_beats(namespace, since_ms, limit)`: the rows that beat at or after
      `since_ms`, of `namespace` and of workers serving every namespace (namespace
      `ALL_NAMESPACES`; None: every row), newest beat first, at most `limit`. Rows are read
      as stored data: a row that cannot be read is skipped, and its lists are bounded
      (`beat_from_row`).
    - `forget_worker(namespace, instance_id)`: delete the row (a worker closing cleanly).
    - `prune_worker_beats(before_ms)`: delete every row that last beat before `before_ms`;
      how many.
    """

    async def beat_worker(self, beat: WorkerBeat) -> None: ...
    async def list_worker_beats(
        self, namespace: str | None, since_ms: int, limit: int
    ) -> list[WorkerBeat]: ...
    async def forget_worker(self, namespace: str, instance_id: str) -> None: ...
    async def prune_worker_beats(self, before_ms: int) -> int: ...


class RetentionStore(Protocol):
    """Pruning finished runs (`durably._core.retention`).

    - `prune_terminal_runs(policy, now_ms, limit, dry_run=False)`: up to `limit` runs the
      policy prunes at `now_ms`, oldest first, deleted with every row that belongs to them
      (checkpoints, waiters, attribute, tag and dedup rows) in ONE transaction; their ids.
      A finished parent with a live child is kept. `dry_run`: the ids, nothing deleted.
    """

    async def prune_terminal_runs(
        self, policy: RetentionPolicy, now_ms: int, limit: int, *, dry_run: bool = False
    ) -> list[str]: ...


class ScheduleStore(Protocol):
    """Persisted schedules, one record per id (`durably._core.schedules`). Each call is one
    statement.

    - `put_schedule(record, if_absent=False, expected_updated_at=None) -> bool`: write the
      record. Plain: an upsert, True. `if_absent`: insert only when the id is free; whether it
      inserted. `expected_updated_at`: replace the stored record only while its `updated_at`
      is that value (compare-and-set); whether it won — False also when the id is gone. The
      two keywords together are a `ValueError`.
    - `get_schedule(id)`: the record or None. `delete_schedule(id)`: whether a record went.
    - `list_schedules(query)`: the records matching every given filter of `query`, ordered by
      `next_fire_at` ascending (None last), then id, paged by `limit`/`offset`.
    """

    async def put_schedule(
        self,
        record: ScheduleRecord,
        *,
        if_absent: bool = False,
        expected_updated_at: int | None = None,
    ) -> bool: ...
    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None: ...
    async def delete_schedule(self, schedule_id: str) -> bool: ...
    async def list_schedules(self, query: ScheduleQuery) -> list[ScheduleRecord]: ...


@runtime_checkable
class StateStore(
    StoreLifecycle,
    RunStore,
    CheckpointStore,
    ScanStore,
    LeaseStore,
    WakeSource,
    SignalStore,
    BufferedSignalAdmin,
    EventStore,
    ReadStore,
    AdmissionStore,
    FleetStore,
    RetentionStore,
    ScheduleStore,
    Protocol,
):
    """Every role: what the engine and the read side need from a store. All methods but
    `wake_bus` are coroutines; reads return fresh copies."""


#: The roles `StateStore` unites, in the order their methods are listed.
STORE_ROLES: tuple[type, ...] = (
    StoreLifecycle,
    RunStore,
    CheckpointStore,
    ScanStore,
    LeaseStore,
    WakeSource,
    SignalStore,
    BufferedSignalAdmin,
    EventStore,
    ReadStore,
    AdmissionStore,
    FleetStore,
    RetentionStore,
    ScheduleStore,
)


def _role_methods(role: type) -> tuple[str, ...]:
    return tuple(
        name for name, value in vars(role).items() if not name.startswith("_") and callable(value)
    )


#: The role that declares each `StateStore` method.
METHOD_ROLES: dict[str, str] = {
    name: role.__name__ for role in STORE_ROLES for name in _role_methods(role)
}

#: The names of every `StateStore` method, role by role in declaration order.
STORE_METHODS: tuple[str, ...] = tuple(METHOD_ROLES)


def missing_store_methods(store: object) -> list[str]:
    """The `StateStore` methods `store` does not have (an empty list: it is complete)."""
    return [name for name in STORE_METHODS if not callable(getattr(store, name, None))]


def require_store(store: object) -> StateStore:
    """`store` itself when it implements every `StateStore` method; else a `TypeError` naming
    the missing ones and their roles. Checked once, where a store enters the engine, so a
    partial store fails at construction instead of half-way through a run."""
    missing = missing_store_methods(store)
    if missing:
        raise TypeError(
            f"{type(store).__name__} is not a complete durably StateStore: it lacks "
            f"{', '.join(missing)} ({_by_role(missing)}; see durably._store.protocol)"
        )
    return cast(StateStore, store)


def _by_role(missing: list[str]) -> str:
    roles: dict[str, list[str]] = {}
    for name in missing:
        roles.setdefault(METHOD_ROLES[name], []).append(name)
    return "; ".join(f"{role}: {len(names)}" for role, names in roles.items())
