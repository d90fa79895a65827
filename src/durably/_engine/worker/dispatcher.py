"""`Dispatcher`: which runs this process executes, and the background tasks it owns.

Every turn of a run in this process goes through `dispatch`: at most one turn of a run at a
time here (a second request while one is being dispatched queues exactly one more turn after
it), nothing new once draining starts, and every background coroutine is tracked so it is
neither garbage-collected mid-flight nor left running after `close`. The other runtime
objects ask it questions (`execution`, `holds`, `load`) instead of reading its sets.

Who runs a turn (`TurnRunner`: the turn driver) and what happens after one
(`after_turn`: the poller's backlog pick-up) are connected once, after construction,
because those objects in turn dispatch through this one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sized
from typing import TYPE_CHECKING, Any, Protocol

from durably._core.log_context import durably_logger
from durably._core.models import WorkflowRun

if TYPE_CHECKING:
    from durably._engine.run.execution import Execution
    from durably._store.protocol import LeaseStore

log = durably_logger("durably.worker")

__all__ = ["Dispatcher", "TurnRunner"]


class TurnRunner(Protocol):
    """Runs one turn of a run (the turn driver)."""

    async def run_one(self, run_id: str) -> bool:
        """Lease the run and run a turn; False when another process holds its lease."""
        ...

    async def drive(self, run: WorkflowRun) -> None:
        """Run a turn of a run this process already leased."""
        ...


class Dispatcher:
    """The runs executing or about to execute here, and this process's background tasks."""

    def __init__(self, store: LeaseStore, *, drive_runs: bool, idle: Sized = ()):
        self._store = store
        self._drive_runs = drive_runs
        # The executions whose bodies wait only for something outside them (a signal, a
        # timer, a child: `ResidentSet.idle`): they hold no room under
        # `max_concurrent_runs`.
        self._idle_runs = idle
        self._executions: dict[str, Execution] = {}
        self._dispatching: set[str] = set()
        # How many of the two above hold each run (1 or 2): a run being dispatched whose turn
        # executes is in both, and is one run of load, not two.
        self._held: dict[str, int] = {}
        self._again: set[str] = set()
        self._claimed: dict[str, WorkflowRun] = {}
        # Runs this process created a moment ago: their first turn skips the checkpoint
        # read (a new run has none).
        self._fresh: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._draining = False
        self._turns: TurnRunner | None = None
        self._nudge: Callable[[str], Awaitable[None]] | None = None
        self._after_turn: Callable[[], None] = lambda: None

    def connect(
        self,
        turns: TurnRunner,
        *,
        nudge: Callable[[str], Awaitable[None]],
        after_turn: Callable[[], None],
    ) -> None:
        """Who runs turns, how a run driven elsewhere is nudged, what follows a turn."""
        self._turns = turns
        self._nudge = nudge
        self._after_turn = after_turn

    # ------------------------------------------------------------------ state

    @property
    def drive_runs(self) -> bool:
        """False for a control replica: it starts and signals runs but never executes them."""
        return self._drive_runs

    @property
    def draining(self) -> bool:
        return self._draining

    def begin_drain(self) -> None:
        self._draining = True

    def reopen(self) -> None:
        self._draining = False

    def execution(self, run_id: str) -> Execution | None:
        """The run's execution when a turn of it runs here now."""
        return self._executions.get(run_id)

    def executions(self) -> list[Execution]:
        """A snapshot of the executions running here."""
        return list(self._executions.values())

    def executing_ids(self) -> list[str]:
        return list(self._executions)

    @property
    def executing_count(self) -> int:
        return len(self._executions)

    def holds(self, run_id: str) -> bool:
        """A turn of the run executes here or is being dispatched here."""
        return run_id in self._executions or run_id in self._dispatching

    @property
    def load(self) -> int:
        """Turns executing or being dispatched here, less those whose bodies wait only for
        something outside them (what `max_concurrent_runs` caps). Such a body costs memory
        only, which `max_resident_runs` bounds; counting it here would let runs waiting for
        a signal or a timer stop this engine from taking any new work."""
        return max(len(self._held) - len(self._idle_runs), 0)

    @property
    def busy(self) -> bool:
        return bool(self._executions or self._dispatching)

    def mark_fresh(self, run_id: str) -> None:
        self._fresh.add(run_id)

    def take_fresh(self, run_id: str) -> bool:
        """True (once) when this process created the run and no turn of it ran yet."""
        if run_id in self._fresh:
            self._fresh.discard(run_id)
            return True
        return False

    def turn_began(self, execution: Execution) -> None:
        if execution.run_id not in self._executions:
            self._hold(execution.run_id)
        self._executions[execution.run_id] = execution

    def turn_ended(self, run_id: str) -> None:
        if self._executions.pop(run_id, None) is not None:
            self._unhold(run_id)
        self._settle_idle()

    # ------------------------------------------------------------------ tasks

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a coroutine in the background, tracked so it is not garbage-collected."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("durably background task failed", exc_info=task.exception())

    def pending_tasks(self) -> list[asyncio.Task[Any]]:
        return [task for task in self._tasks if not task.done()]

    async def cancel_tasks(self) -> None:
        """Cancel the background tasks still running (at close, after the drain)."""
        leftovers = self.pending_tasks()
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.gather(*leftovers, return_exceptions=True)

    # ------------------------------------------------------------------ dispatch

    def dispatch(
        self, run_id: str, *, nudge: bool = False, claimed: WorkflowRun | None = None
    ) -> None:
        """Run a turn of the run on this process, soon.

        With `nudge`, a run whose lease another process holds gets its wakeAt set to now.
        `claimed` is a run this process already leased (batch pick-up): it is driven as is.
        """
        if not self._drive_runs or self._draining:
            if claimed is not None:
                self.spawn(self._store.release_run_lock(run_id))
            return
        if claimed is not None:
            self._claimed[run_id] = claimed
        if run_id in self._dispatching:
            # A turn of this run is being dispatched here: run one more turn after it.
            self._again.add(run_id)
            return
        self._dispatching.add(run_id)
        self._hold(run_id)
        self._idle.clear()
        self.spawn(self._go(run_id, nudge))

    async def _go(self, run_id: str, nudge: bool) -> None:
        turns, nudger = self._turns, self._nudge
        assert turns is not None and nudger is not None, "Dispatcher.connect was not called"
        try:
            while True:
                self._again.discard(run_id)
                leased = self._claimed.pop(run_id, None)
                if leased is not None:
                    acquired = True
                    await turns.drive(leased)
                else:
                    acquired = await turns.run_one(run_id)
                if not acquired:
                    # Another process has the run (and may have run turns of it): this
                    # process's "created here, nothing to read" no longer holds.
                    self._fresh.discard(run_id)
                if nudge and not acquired:
                    await nudger(run_id)
                if run_id not in self._again or self._draining:
                    break
        finally:
            self._again.discard(run_id)
            self._dispatching.discard(run_id)
            self._unhold(run_id)
            self._settle_idle()
            self._after_turn()

    def _hold(self, run_id: str) -> None:
        self._held[run_id] = self._held.get(run_id, 0) + 1

    def _unhold(self, run_id: str) -> None:
        left = self._held.get(run_id, 0) - 1
        if left > 0:
            self._held[run_id] = left
        else:
            self._held.pop(run_id, None)

    def _settle_idle(self) -> None:
        if not self._executions and not self._dispatching:
            self._idle.set()

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until no turn is executing or dispatched here."""
        await asyncio.wait_for(self._idle.wait(), timeout)
