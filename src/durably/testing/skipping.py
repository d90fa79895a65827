"""`TimeSkipper`: moves an environment's clock to the next deadline as soon as nothing but
time is left to wait for.

The rule, judged from the real store (not through the engine's wrapper, which may be dead)
after every write and every few milliseconds of real time:

1. Anything in flight stops the jump. A run of the environment's namespace that is
   `pending` (waiting to be picked up), `running` (a turn is executing: a step, a write, a
   step in flight elsewhere) or `cancelling` is work under way; so is a `suspended` run whose
   wake time has already come (the engine is about to wake it: the skipper asks it to at
   once). A write landing while the skipper looks (a signal being delivered, a turn
   starting) makes it look again: the jump happens only when two looks with no write between
   them agree, after the event loop had the chance to run everything that was ready.
2. Otherwise the clock moves to the EARLIEST deadline, never further, so no live wait is
   ever carried past a deadline it had not reached. A deadline is one that a suspended run's
   history backs — a durable sleep, the timeout of a wait, the back-off of a failed step
   before its next attempt (each a checkpoint row with that wake time) — the moment a
   workflow's `execution_timeout` cancels a run, or the opening of the next window of one of
   the engine's schedules. A wake time no row backs is the engine's own safety-net re-check
   of a run waiting for a signal or a child; it is not a deadline, so the clock never jumps
   to it.
3. The timeout of a wait that something outside the runs can end — a signal, an event, an
   update (a `timeout:` row whose token is not a child's) — is a deadline only while the test
   awaits an outcome through the environment (`WorkflowEnvironment.run` / `result`): until
   then the test may still be about to send what the run waits for, in real time, so the
   clock neither jumps to that timeout nor past it (a jump to a later deadline waits too).
   Timeouts of waits for child runs count at once, like sleeps: the children are the
   environment's own runs, judged by this same rule.
4. After a jump the engine is asked to poll at once (due timers, execution timeouts,
   schedules, pending runs) instead of after `timer_poll_ms` of real time.

Runs `blocked` for a worker and runs of other namespaces neither stop a jump nor set one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from durably._core.log_context import durably_logger
from durably._core.models import RunQuery, RunStatus, StepCheckpoint, WorkflowRun
from durably._engine.defs.registry import Workflow
from durably._engine.defs.schedules import Schedule, next_cron_fire_ms
from durably.testing.clock import TestClock
from durably.testing.crash import WriteLog

__all__ = ["Plan", "PolledEngine", "SkipperStore", "TimeSkipper", "deadline_kind"]

log = durably_logger("durably.testing")

# How often the skipper looks without being woken by a write (real seconds).
_LOOK_EVERY = 0.02

_BUSY: tuple[RunStatus, ...] = ("pending", "running", "cancelling")


class SkipperStore(Protocol):
    """The reads the skipper makes of the real store."""

    async def list_runs(self, query: RunQuery) -> list[WorkflowRun]: ...
    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]: ...


class PolledEngine(Protocol):
    """What the skipper asks of the environment's engine after a jump: one pass of each
    poll duty (`durably.Engine`'s polling-by-hand methods)."""

    async def resume_due_timers(self) -> int: ...
    async def sweep_timeouts(self) -> int: ...
    async def run_pending(self) -> int: ...
    async def fire_schedules(self) -> list[str]: ...
    def registration(self, name: str, version: str | None = None) -> Workflow[Any, Any] | None: ...


DeadlineKind = Literal["timer", "outside"]


def deadline_kind(wake_at: int, rows: list[StepCheckpoint]) -> DeadlineKind | None:
    """What recorded `wake_at` (rule 2 and 3 of the module doc): `"timer"` (a sleep, a
    step's back-off, a child wait's timeout), `"outside"` (the timeout of a wait for a
    signal, an event or an update), or None (no row backs it: not a deadline)."""
    found: DeadlineKind | None = None
    for cp in rows:
        if cp.wake_at != wake_at:
            continue
        if cp.kind == "sleep" and cp.name.startswith("timeout:"):
            if cp.name.startswith("timeout:child:"):
                return "timer"
            found = "outside"
        elif cp.kind == "sleep" or cp.status == "failed":
            return "timer"
    return found


@dataclass(frozen=True)
class Plan:
    """One look at the store: `busy` (work in flight), `due` (a wake time has come), or the
    deadline to jump to (`jump_to`, epoch ms; None with neither flag: nothing to wait for)."""

    busy: bool = False
    due: bool = False
    pending: bool = False
    jump_to: int | None = None


class TimeSkipper:
    """The environment's background task: jumps the clock (when `skipping`) and nudges the
    engine after every move of the clock, by the skipper or by the test."""

    def __init__(
        self,
        store: SkipperStore,
        clock: TestClock,
        writes: WriteLog,
        engine: Callable[[], PolledEngine | None],
        *,
        namespace: str | None,
        skipping: bool,
        schedules: Sequence[Schedule] = (),
    ):
        self._store = store
        self._clock = clock
        self._writes = writes
        self._engine = engine
        self._namespace = namespace
        self._schedules = list(schedules)
        self.skipping = skipping
        self._awaiting = 0
        self._poke = asyncio.Event()
        self._moved = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.jumps = 0
        writes.listen(self._poke.set)
        clock.on_move(self._clock_moved)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="durably-skipper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        # A flag rather than only a cancel: on Python 3.11 `wait_for` can swallow a cancel
        # that arrives as its wait ends, and the loop would go on.
        self._stopping = True
        self._poke.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), 5.0)
        except TimeoutError:
            task.cancel()

    @contextlib.asynccontextmanager
    async def awaiting(self) -> AsyncIterator[None]:
        """`async with skipper.awaiting():` around a wait for an outcome (rule 3)."""
        self._awaiting += 1
        self._poke.set()
        try:
            yield
        finally:
            self._awaiting -= 1

    def _clock_moved(self) -> None:
        self._moved = True
        self._poke.set()

    # ------------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await asyncio.wait_for(self._poke.wait(), _LOOK_EVERY)
            except TimeoutError:
                pass
            self._poke.clear()
            if self._stopping:
                return
            try:
                if self._moved:
                    self._moved = False
                    await self._nudge()
                if self.skipping:
                    await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a crashed or closing store: look again later
                log.debug("time skipper: %s", exc)

    async def step(self) -> bool:
        """One look, and the jump when the rule allows it; True when the clock moved."""
        before = self._writes.count
        plan = await self.plan()
        if plan.due or plan.pending:
            await self._nudge()
            return False
        if plan.busy or plan.jump_to is None:
            return False
        # Let everything that was ready run (a delivery's wake, a dispatched turn), then
        # look again: the jump needs two agreeing looks with no write between them.
        for _ in range(5):
            await asyncio.sleep(0)
        if self._writes.count != before or await self.plan() != plan:
            self._poke.set()
            return False
        self._clock.set(max(self._clock.now(), plan.jump_to))
        self.jumps += 1
        self._moved = False
        await self._nudge()
        return True

    async def plan(self) -> Plan:
        """Look at the store (module doc)."""
        store = self._store
        now = self._clock.now()
        busy = await store.list_runs(
            RunQuery(statuses=list(_BUSY), namespace=self._namespace, limit=1)
        )
        if busy:
            return Plan(busy=True, pending=busy[0].status == "pending")
        timers = [self._next_window(schedule, now) for schedule in self._schedules]
        barrier: int | None = None  # an outside wait's timeout nobody awaits: never passed
        for run in await store.list_runs(
            RunQuery(statuses=["suspended"], namespace=self._namespace)
        ):
            timeout_at = self._execution_deadline(run)
            if timeout_at is not None:
                if timeout_at <= now:
                    return Plan(due=True)  # the timeout sweep is about to cancel it
                timers.append(timeout_at)
            wake_at = run.wake_at
            if wake_at is None:
                continue
            if wake_at <= now:
                return Plan(due=True)
            kind = deadline_kind(wake_at, await store.list_checkpoints(run.id))
            if kind == "timer" or (kind == "outside" and self._awaiting > 0):
                timers.append(wake_at)
            elif kind == "outside":
                barrier = wake_at if barrier is None else min(barrier, wake_at)
        jump_to = min((t for t in timers if t is not None), default=None)
        if jump_to is not None and barrier is not None and jump_to >= barrier:
            jump_to = None  # rule 3: the test may still send what that run waits for
        return Plan(jump_to=jump_to)

    def _execution_deadline(self, run: WorkflowRun) -> int | None:
        """When the run's `execution_timeout` cancels it, if its workflow has one."""
        engine = self._engine()
        workflow = (
            None if engine is None else engine.registration(run.workflow, run.workflow_version)
        )
        if workflow is None or workflow.execution_timeout_ms is None:
            return None
        return int(run.created_at.timestamp() * 1000) + workflow.execution_timeout_ms

    @staticmethod
    def _next_window(schedule: Schedule, now: int) -> int | None:
        """When the schedule's next window opens (its run starts then), after `now`."""
        if schedule.paused:
            return None
        if schedule.cron is not None:
            return next_cron_fire_ms(schedule.cron, now, schedule.timezone)
        every = schedule.every_ms
        return now - now % every + every

    async def _nudge(self) -> None:
        engine = self._engine()
        if engine is None:
            return
        duties: tuple[Callable[[], Awaitable[object]], ...] = (
            engine.resume_due_timers,
            engine.sweep_timeouts,
            engine.fire_schedules,
            engine.run_pending,
        )
        for duty in duties:
            await duty()
