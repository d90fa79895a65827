"""One run executing on this engine instance: its snapshot, parking and step execution.

Two ways to wait:

* **Resident** (default): a body that waits (sleep, signal, child, retry backoff) stays alive
  in memory. The run is written `suspended` with its `wakeAt` (so a crash leaves a durable,
  recoverable state) while this instance keeps the lease, and the parked coroutine is woken
  in place by an in-memory timer or by a delivery on this instance. A run that stays on its
  instance is therefore never replayed: no replay on the hot path.
* **Classic** (after eviction, and in `always_replay` test mode): a wait raises
  `WorkflowSuspended`, the turn ends, and a later turn replays the body from its checkpoints.

Both modes write the same checkpoints, so a run can move between them at any step.

A wait for a step in flight (a remote step's result) is *lazy*: the run stays `running`, its
lease held, and `suspended` is written only if the wait outlives `SUSPEND_AFTER_MS` or the run
is evicted. A remote round trip of a few milliseconds then costs the pending row and the
settlement, not two status writes and a re-read as well. See `Execution._park`.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from durably._core.errors import (
    ContinueAsNew,
    NonDeterminismError,
    RunEvicted,
    WorkflowSuspended,
    _ControlFlow,
)
from durably._core.log_context import durably_logger
from durably._core.models import (
    LIVE_RUN_STATUSES,
    CheckpointKind,
    CheckpointStatus,
    JSONValue,
    RunPatch,
    RunStatus,
    StepCheckpoint,
    StepError,
    StepEvent,
    WorkflowRun,
    replace,
    utc_from_ms,
)
from durably._engine.control.operator import redispatch_requested
from durably._engine.defs.events import EngineEvent
from durably._engine.defs.registry import Workflow
from durably._engine.run.guarded import GuardedStore, RunSideStore

if TYPE_CHECKING:
    from durably._engine.run.host import RunHost

log = durably_logger("durably.engine")

# Nested-call guard: (owning execution, step name) while an in-process step body runs; a
# primitive of the SAME run called inside it raises NestedWorkflowCallError.
STEP_SCOPE: contextvars.ContextVar[tuple[Execution, str] | None] = contextvars.ContextVar(
    "durably_step_scope", default=None
)
# The ctx of the workflow body running on this async path ("ambient ctx"): inside a body,
# `MyWorkflow.start()/execute()` become child starts.
AMBIENT_CTX: contextvars.ContextVar[Any] = contextvars.ContextVar("durably_ctx", default=None)


# How long a lazy wait (a step in flight elsewhere) may last before the run is written
# `suspended`. Below it, the status writes would cost more than the step; above it, the run
# shows as waiting and the lost-wake guard (which needs the durable `suspended` state) runs.
# A delivery from another process that raced the park is still seen within this bound even
# without a wake bus.
SUSPEND_AFTER_MS = 100

_COMPLETED: tuple[CheckpointStatus, ...] = ("completed",)
SETTLED: tuple[CheckpointStatus, ...] = ("completed", "failed")


class ReplayNow(_ControlFlow):
    """`always_replay` test mode: end the turn after a live checkpoint and replay at once."""


@dataclass(frozen=True, slots=True)
class Wake:
    kind: Literal["delivered", "timer", "recheck"]


@dataclass(slots=True)
class _Parked:
    seq: int | None
    deadline: int | None
    future: asyncio.Future[Wake]
    timer: asyncio.TimerHandle | None = None
    lazy: bool = False
    # Waits for something outside the run (a signal, a timer, a child) free its slot under
    # `max_concurrent_runs`; waits that are part of a step's execution (a slot of a
    # flow-control queue, a step in flight elsewhere) keep it.
    frees_slot: bool = False


class Execution:
    """The in-memory state of one run while this instance drives it."""

    def __init__(
        self,
        host: RunHost,
        run: WorkflowRun,
        workflow: Workflow[Any, Any],
        checkpoints: list[StepCheckpoint],
    ):
        self.host = host
        # Store failures inside a turn end the turn (they are not the body's to catch).
        self.store: RunSideStore = GuardedStore(host.store)
        self.run = run
        self.run_id = run.id
        self.workflow = workflow
        self.snapshot: dict[int, StepCheckpoint] = {cp.seq: cp for cp in checkpoints}
        self.replay_frontier = max((cp.seq for cp in checkpoints if cp.seq >= 0), default=-1)
        self.position = 0
        self.task: asyncio.Task[Any] | None = None
        self.parked: dict[int, _Parked] = {}
        self._parked_at: dict[int, set[int]] = {}  # seq -> keys of `parked` waiting on it
        self._park_ids = 0
        self.active_steps = 0
        self.closed = False  # the turn ended: orphaned gather branches must stop here
        self._steps_idle = asyncio.Event()
        self._steps_idle.set()
        self.store_status: RunStatus = run.status
        self.cancelled = False
        self.resident = not host.options.always_replay
        self.waiting_seqs: set[int] = set()
        # Fans waiting here (fans.py): told of every delivered checkpoint in O(1), so a fan
        # of N members parks once instead of N times (deliver() walks `parked`).
        self.fan_watches: list[Callable[[StepCheckpoint], None]] = []
        self.compensations: list[Any] = []  # the saga stack (saga.py)
        # A `cancelling` run is cancel-requested; its turn
        # must reach an exit (never park resident) so the unwind can run there.
        self.cancel_requested = run.status == "cancelling"
        if self.cancel_requested:
            self.resident = False
        # Lazy waits (module docstring): the pending `suspended` write, and the write itself
        # once it started (an unpark waits for it, so `running` never lands before it).
        self._suspend_timer: asyncio.TimerHandle | None = None
        self._suspend_task: asyncio.Task[Any] | None = None
        # Re-check wakes received (`deliver(None, None)`): a wait compares it with the value
        # from before its step was dispatched, so a nudge that came before it parked is not
        # lost (the nudge found nothing parked to wake).
        self.rechecks = 0
        # Set by `evict` when the run was still written `running` (only lazy waits were
        # parked): the turn's exit then writes `suspended` with this wake time.
        self.evicted_unsuspended = False
        self.evicted_wake_at: int | None = None

    # ------------------------------------------------------------------ positions

    def claim(self, count: int = 1) -> int:
        if self.closed:
            # A branch of an asyncio.gather still running after its turn ended (classic
            # mode): it must not claim positions the next turn will own.
            raise RunEvicted()
        seq = self.position
        self.position += count
        return seq

    @property
    def replaying(self) -> bool:
        return self.position <= self.replay_frontier

    def now(self) -> int:
        return self.host.clock()

    # ------------------------------------------------------------------ checkpoints

    def instant(
        self,
        seq: int,
        name: str,
        kind: CheckpointKind,
        *,
        output: JSONValue = None,
        input: JSONValue = None,
        status: CheckpointStatus = "completed",
        wake_at: int | None = None,
        parallel_group: str | None = None,
    ) -> StepCheckpoint:
        """An "instant" checkpoint: all timestamps now, attempts 1."""
        now = self.now()
        return self.step_row(
            seq,
            name,
            kind,
            status,
            input,
            1,
            now,
            now,
            output=output,
            wake_at=wake_at,
            parallel_group=parallel_group,
        )

    async def save(self, cp: StepCheckpoint, *, remember: bool = True) -> None:
        await self.store.save_checkpoint(cp)
        if remember:
            self.snapshot[cp.seq] = cp

    def after_live_checkpoint(self) -> None:
        """always_replay: evict after every live step so the next turn replays it."""
        if self.host.options.always_replay:
            raise ReplayNow()

    def emit(self, type_: Any, **fields: Any) -> None:
        bus = self.host.events
        if not bus.observed and type_.startswith("step."):
            bus.count_step(
                type_[5:],
                self.run.workflow,
                fields.get("name"),
                duration_ms=fields.get("duration_ms"),
                error=fields.get("error"),
                attempt=fields.get("attempt"),
            )
            return
        if type_.startswith("step."):
            # A step this execution runs itself runs in this process; the dispatch path
            # (a step sent to a worker) says `remote`.
            fields.setdefault("placement", "in_process")
        bus.emit(EngineEvent(type=type_, run_id=self.run_id, workflow=self.run.workflow, **fields))

    def expect_name(self, seq: int, cp: StepCheckpoint | None, name: str) -> None:
        # Replay must make the same calls in the same order: a recorded checkpoint with
        # another name at this position means the code changed under the run.
        if cp is not None and cp.name != name:
            raise NonDeterminismError(self.run_id, seq, name, cp.name)

    # ------------------------------------------------------------------ waiting

    async def wait(
        self,
        seq: int | None,
        deadline: int | None,
        *,
        accept: tuple[CheckpointStatus, ...] = _COMPLETED,
        lazy_since: int | None = None,
        frees_slot: bool = False,
        also: Callable[[StepCheckpoint], bool] | None = None,
    ) -> StepCheckpoint | None:
        """Wait until the checkpoint at `seq` has one of the `accept` statuses (completed, by
        default; a dispatched step also accepts failed) and return it, or until `deadline`
        passes (None). Classic mode suspends the turn instead of waiting. `also` accepts a
        row whatever its status (a pending remote row an operator asked to send again).

        `lazy_since` makes it a lazy wait (a step in flight elsewhere; module docstring): the
        value of `rechecks` from before the step was dispatched, so a re-check wake that
        arrived before this wait parked makes it re-read the row first."""
        while True:
            if lazy_since is not None and seq is not None and self.rechecks != lazy_since:
                lazy_since = self.rechecks
                fresh = await self.store.get_checkpoint(self.run_id, seq)
                if fresh is not None:
                    self.snapshot[seq] = fresh
            if seq is not None:
                cp = self.snapshot.get(seq)
                if cp is not None and (cp.status in accept or (also is not None and also(cp))):
                    return cp
            if deadline is not None and self.now() >= deadline:
                return None
            if not self.resident:
                if seq is not None:
                    self.waiting_seqs.add(seq)
                raise WorkflowSuspended(deadline)
            wake = await self._park(
                seq, deadline, accept, lazy=lazy_since is not None, frees_slot=frees_slot
            )
            if wake.kind == "recheck" and seq is not None:
                fresh = await self.store.get_checkpoint(self.run_id, seq)
                if fresh is not None:
                    self.snapshot[seq] = fresh

    async def _park(
        self,
        seq: int | None,
        deadline: int | None,
        accept: tuple[CheckpointStatus, ...] = _COMPLETED,
        *,
        lazy: bool = False,
        frees_slot: bool = False,
    ) -> Wake:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Wake] = loop.create_future()
        self._park_ids += 1
        key = self._park_ids
        parked = _Parked(seq, deadline, future, lazy=lazy, frees_slot=frees_slot)
        if deadline is not None:
            delay = max(0.0, (deadline - self.now()) / 1000.0)
            parked.timer = loop.call_later(delay, _resolve, future, Wake("timer"))
        self.parked[key] = parked
        if seq is not None:
            self._parked_at.setdefault(seq, set()).add(key)
        self.host.resident.note_parked(self)
        self._report_idle()
        try:
            if lazy:
                # Nothing is written now (module docstring); a run already written
                # `suspended` stays so, with the wake time it has.
                self._defer_suspend()
            else:
                await self.mark_suspended()
            if not lazy and seq is not None and accept and not future.done():
                # Lost-wake guard: a delivery from another process may have written our
                # checkpoint before our `suspended` write; its nudge then came too early.
                fresh = await self.store.get_checkpoint(self.run_id, seq)
                if fresh is not None and fresh.status in accept:
                    self.snapshot[seq] = fresh
                    _resolve(future, Wake("delivered"))
            wake = await future
        finally:
            self.parked.pop(key, None)
            if seq is not None:
                keys = self._parked_at.get(seq)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._parked_at[seq]
            if not self.parked:
                self.host.resident.note_unparked(self)
                self._cancel_deferred_suspend()
            if parked.timer is not None:
                parked.timer.cancel()
            self._report_idle()
        if not self.parked:
            writing = self._suspend_task
            if writing is not None and not writing.done():
                # A lazy `suspended` write is under way: let it land first, so `running`
                # is the last word.
                await asyncio.wait({writing})
            if not self.parked and self.store_status == "suspended":
                await self.mark_running()
        return wake

    def _defer_suspend(self) -> None:
        """Write `suspended` in `SUSPEND_AFTER_MS` unless every wait ended by then."""
        if self._suspend_timer is not None or self.store_status == "suspended":
            return
        self._suspend_timer = asyncio.get_running_loop().call_later(
            SUSPEND_AFTER_MS / 1000.0, self._suspend_due
        )

    def _cancel_deferred_suspend(self) -> None:
        if self._suspend_timer is not None:
            self._suspend_timer.cancel()
            self._suspend_timer = None

    def _suspend_due(self) -> None:
        self._suspend_timer = None
        if self.parked and self.resident and not self.cancelled and not self.closed:
            self._suspend_task = self.host.spawn(self._suspend_lazily())

    async def _suspend_lazily(self) -> None:
        """The deferred write of a lazy wait, then the lost-wake guard for the lazily parked
        rows: a delivery from another process may have landed before the write (its nudge of
        `wakeAt` is overwritten by it). A failed write ends the parked waits with the error,
        as it would have ended an eager park (a run settled elsewhere, a store that failed)."""
        try:
            if not await self.mark_suspended():
                # Not written (a step of the body is executing or writing its row): no
                # `wakeAt` was overwritten, so there is nothing to re-read. The next wait to
                # park defers the write again.
                return
            seqs = {p.seq for p in self.parked.values() if p.lazy and p.seq is not None}
            if len(seqs) > 8:
                # A fan's members: one listing instead of a read per member.
                rows = [cp for cp in await self.store.list_checkpoints(self.run_id)]
                found = [cp for cp in rows if cp.seq in seqs]
            else:
                found = []
                for seq in sorted(seqs):
                    cp = await self.store.get_checkpoint(self.run_id, seq)
                    if cp is not None:
                        found.append(cp)
            for cp in found:
                # A settled row, or one an operator asked to send again (`redispatch_pending`
                # from a process whose nudge this write overwrote).
                if cp.kind == "remote" and (cp.status in SETTLED or redispatch_requested(cp)):
                    self.deliver(cp.seq, cp)
        except BaseException as exc:
            for parked in list(self.parked.values()):
                if not parked.future.done():
                    parked.future.set_exception(
                        exc if isinstance(exc, _ControlFlow) else RunEvicted()
                    )
            if not isinstance(exc, Exception | _ControlFlow):
                raise

    async def mark_suspended(self) -> bool:
        """Record a resident wait durably: status `suspended` and the earliest wake time.
        False when nothing was to be written: the body is not only waiting (a step of it is
        executing or writing its row, or nothing is parked) or the run was cancelled."""
        if self.active_steps or not self.parked or self.cancelled:
            return False
        self._cancel_deferred_suspend()
        deadlines = [p.deadline for p in self.parked.values() if p.deadline is not None]
        wake_at = min(deadlines) if deadlines else self.host.fallback_wake_at()
        if self.store_status == "suspended" and self.run.wake_at == wake_at:
            return True
        self.store_status = "suspended"
        self.run = replace(self.run, status="suspended", wake_at=wake_at)
        await self._write_status({"status": "suspended", "wake_at": wake_at})
        self.emit("run.suspended", namespace=self.run.namespace)
        # `suspended` settles `wait_for_run` in other processes too
        self.host.wakes.announce_soon("settled", self.run_id)
        return True

    async def mark_running(self) -> None:
        if self.cancelled:
            return
        self.store_status = "running"
        self.run = replace(self.run, status="running", wake_at=None)
        await self._write_status({"status": "running", "wake_at": None})

    async def _write_status(self, patch: RunPatch) -> None:
        """A conditional status write: a run settled elsewhere (say, cancelled by another
        process) is never resurrected; this turn stops instead."""
        written = await self.store.update_run_if_status(self.run_id, patch, LIVE_RUN_STATUSES)
        if not written:
            self.cancelled = True
            raise RunEvicted()

    def deliver(self, seq: int | None, cp: StepCheckpoint | None) -> None:
        """A wake for this resident run: a delivered checkpoint, or a nudge to re-check."""
        if cp is not None:
            self.snapshot[cp.seq] = cp
            for watch in self.fan_watches:
                watch(cp)
            # Only the waits on this seq: a fan of N dispatched steps parks N waits, and a
            # walk over all of them per delivery would cost O(N²).
            for key in tuple(self._parked_at.get(cp.seq, ())):
                _resolve(self.parked[key].future, Wake("delivered"))
            return
        if seq is None:
            self.rechecks += 1
        for parked in list(self.parked.values()):
            if seq is None or parked.seq == seq:
                _resolve(parked.future, Wake("recheck"))

    async def park_for_fan(self) -> bool:
        """Park the body until `poke()` (True) or a re-check wake (False: something was
        written elsewhere; re-read the store)."""
        wake = await self._park(None, None, frees_slot=True)  # a wave of child runs
        return wake.kind == "delivered"

    async def wait_for_slot(self, seq: int, retry_at: int) -> None:
        """Step `seq` waits for a flow-control queue to admit it: resident, parked until
        `retry_at` or until a release names it next in line (`deliver(seq, None)`); classic,
        the turn suspends until `retry_at`."""
        if self.now() >= retry_at:
            return
        if not self.resident:
            raise WorkflowSuspended(retry_at)
        await self._park(seq, retry_at, accept=())

    def poke(self) -> None:
        """Wake `park_for_fan` (a fan's watch saw what it waits for)."""
        for parked in list(self.parked.values()):
            if parked.seq is None and parked.deadline is None:
                _resolve(parked.future, Wake("delivered"))

    def evict(self) -> None:
        """Drop the resident coroutine. Its durable state is written, except after lazy waits
        only: then `evicted_unsuspended` asks the turn's exit to write `suspended`."""
        self.resident = False
        self._cancel_deferred_suspend()
        if self.parked and self.store_status != "suspended":
            self.evicted_unsuspended = True
            deadlines = [p.deadline for p in self.parked.values() if p.deadline is not None]
            self.evicted_wake_at = min(deadlines) if deadlines else None
            self.waiting_seqs.update(p.seq for p in self.parked.values() if p.seq is not None)
        self._end_parked_waits()

    def _end_parked_waits(self) -> None:
        """Wake every parked wait with `RunEvicted` and take this execution out of the
        resident set's counts now (each wait's own clean-up comes a loop turn later)."""
        for parked in list(self.parked.values()):
            if not parked.future.done():
                parked.future.set_exception(RunEvicted())
        self.host.resident.note_unparked(self)
        self.host.resident.note_idle(self, False)

    def step_began(self) -> None:
        """A step of the body starts executing, or writing its row: the turn's `close` waits
        until `step_ended`. Call `step_ended` only once the step's row is written, so the
        next turn of the run reads it instead of running the step a second time.

        Raises `RunEvicted` once the turn has ended: a branch of a gather still running after
        its sibling suspended the turn (classic mode) must not start a step the next turn
        will start too."""
        if self.closed:
            raise RunEvicted()
        self.active_steps += 1
        self._steps_idle.clear()
        self._report_idle()

    def step_ended(self) -> None:
        self.active_steps -= 1
        if self.active_steps == 0:
            self._steps_idle.set()
        self._report_idle()

    def _report_idle(self) -> None:
        """Tell the resident set whether the body now only waits for things outside it (it
        then holds no slot under `max_concurrent_runs`)."""
        idle = (
            bool(self.parked)
            and self.active_steps == 0
            and all(p.frees_slot for p in self.parked.values())
        )
        self.host.resident.note_idle(self, idle)

    async def close(self) -> None:
        """End the turn: wait for steps still executing in sibling branches of a gather,
        so their checkpoints land before the run is settled or handed to a new turn.

        A wait still parked now belongs to a branch the body left behind (its gather failed
        or returned on another branch): it is woken with `RunEvicted`, or the finished run
        would stay in the resident set, counted as a run waiting for a signal."""
        self.closed = True
        self._end_parked_waits()
        await self._steps_idle.wait()

    @property
    def is_parked(self) -> bool:
        return bool(self.parked) and self.active_steps == 0

    # ------------------------------------------------------------------ step rows

    async def resuspend_if_idle(self) -> None:
        # A step finished while other waits of a gather are parked: the body is idle again.
        if self.parked and not self.active_steps and self.store_status != "suspended":
            if all(p.lazy for p in self.parked.values()):
                self._defer_suspend()
            else:
                await self.mark_suspended()

    def step_row(
        self,
        seq: int,
        name: str,
        kind: CheckpointKind,
        status: CheckpointStatus,
        input: JSONValue,
        attempts: int,
        started: int,
        finished: int,
        *,
        output: JSONValue = None,
        error: StepError | None = None,
        wake_at: int | None = None,
        events: tuple[StepEvent, ...] | None = None,
        parallel_group: str | None = None,
    ) -> StepCheckpoint:
        return StepCheckpoint(
            run_id=self.run_id,
            seq=seq,
            name=name,
            kind=kind,
            step_id=f"{self.run_id}:{seq}",
            status=status,
            input=input,
            output=output,
            error=error,
            attempts=attempts,
            wake_at=wake_at,
            events=events or None,
            parallel_group=parallel_group,
            enqueued_at=utc_from_ms(started),
            started_at=utc_from_ms(started),
            finished_at=utc_from_ms(finished),
        )


def _resolve(future: asyncio.Future[Wake], wake: Wake) -> None:
    if not future.done():
        future.set_result(wake)


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0


__all__ = [
    "AMBIENT_CTX",
    "STEP_SCOPE",
    "ContinueAsNew",
    "Execution",
    "ReplayNow",
    "Wake",
]
