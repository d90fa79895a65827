"""`Deliveries`: waking runs in this process, and the runtime's internal signal route.

A signal's delivery, a re-drive after something a run waits for happened, a nudge for a run
driven elsewhere, and a finished run's completion on its way to its parent all go through
it. As a `SignalRoute` it may address any token, the engine's own waiter namespaces
included (child completions, breakpoints, updates); the public `Engine.signal` checks the
token first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from durably._core.log_context import durably_logger
from durably._core.models import (
    LIVE_RUN_STATUSES,
    RunPatch,
    StepCheckpoint,
    WorkflowRun,
)
from durably._engine.control.signals import Announcer, BufferBounds, CompletionMailbox, signal
from durably._engine.defs.vocab import PARENT_TAG_PREFIX, may_have_parent
from durably._engine.worker.runs import BackgroundTasks, DriveState, ExecutingRuns, Redispatch

if TYPE_CHECKING:
    from durably._store.protocol import StateStore

log = durably_logger("durably.worker")


class DeliveryRuns(ExecutingRuns, Redispatch, DriveState, BackgroundTasks, Protocol):
    """What waking a run asks of the runs here: is a turn of it executing (resident, to
    deliver to in memory), run a turn of it, may this process drive it now, and where the
    background notification of a parent runs."""


class Deliveries:
    """Waking runs in this process: a signal's delivery, a re-drive after something a run
    waits for happened, a nudge for a run driven elsewhere, and a finished run's completion
    on its way to its parent. It is the `SignalRoute` of the runtime's internal signals."""

    def __init__(
        self,
        store: StateStore,
        *,
        clock: Callable[[], int],
        signal_buffer: BufferBounds,
        runs: DeliveryRuns,
        wakes: Announcer,
        mailbox: CompletionMailbox,
    ):
        self._store = store
        self._clock = clock
        self._signal_buffer = signal_buffer
        self._runs = runs
        self._wakes = wakes
        self._mailbox = mailbox

    @property
    def store(self) -> StateStore:
        return self._store

    @property
    def signal_buffer(self) -> BufferBounds:
        return self._signal_buffer

    @property
    def clock(self) -> Callable[[], int]:
        return self._clock

    async def redrive(self, run_id: str, cp: StepCheckpoint | None = None) -> None:
        """Wake a run after something it waits for happened."""
        runs = self._runs
        execution = runs.execution(run_id)
        if execution is not None:
            if execution.resident:
                execution.deliver(cp.seq if cp else None, cp)
            else:
                # A classic turn is ending: queue one more turn after it, so a delivery
                # racing its settle is never left to the reconcile fallback.
                runs.dispatch(run_id)
            return
        if runs.drive_runs and not runs.draining:
            runs.dispatch(run_id, nudge=True)
        else:
            await self.nudge(run_id)

    async def nudge(self, run_id: str) -> None:
        """The run is driven elsewhere (another process holds its lease, or this engine
        does not drive): make it due now, so the holder's timer poll wakes it, and announce
        it on the wake bus so that happens within milliseconds."""
        patch: RunPatch = {"wake_at": self._clock()}
        if await self._store.update_run_if_status(run_id, patch, LIVE_RUN_STATUSES):
            await self._wakes.announce("ready", run_id)

    def notify_parent(self, run: WorkflowRun | str, completion: dict[str, Any]) -> None:
        """Tell a finished run's parent: deferred `signal('child:<runId>', completion)`.

        Only runs that can have a parent are announced — runs started by a parent (tagged
        `durable:parent:<id>`), retries of runs (`~retry~`), or a bare id (a child whose
        start failed). A top-level run would only leave a buffered completion behind that
        nobody ever takes (three store statements and one orphan row per run).
        """
        if isinstance(run, WorkflowRun):
            if not may_have_parent(run):
                return
            run_id = run.id
            parents = [
                t[len(PARENT_TAG_PREFIX) :]
                for t in run.tags or ()
                if t.startswith(PARENT_TAG_PREFIX)
            ]
            if parents and "~retry~" not in run_id:
                # Batched per parent (children.ChildMailbox): a fan's completions share
                # one delivery transaction and one wake of the parent per batch.
                self._mailbox.post(parents[0], run_id, completion)
                return
        else:
            run_id = run

        async def notify() -> None:
            await signal(self, f"child:{run_id}", completion)
            if "~retry~" in run_id and completion.get("ok"):
                await signal(self, f"child:{run_id.split('~retry~')[0]}", completion)

        self._runs.spawn(notify())
