"""`EngineRuns`: the `LocalRuns` hooks an `Engine` gives the `Client` it is composed of.

A client's operation touches only the store and the wake bus; these hooks add what an engine
that drives runs in the same process must do as well — drive a run it just created, wake a
resident execution when a signal arrives, interrupt a local execution that was cancelled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durably._core.models import StepCheckpoint, StepError, WorkflowRun
from durably._engine import signals
from durably._engine.events import EngineEvent
from durably._engine.operator import current_task

if TYPE_CHECKING:
    from durably._engine.engine import Engine
    from durably._engine.registry import Workflow

__all__ = ["EngineRuns"]


class EngineRuns:
    """The local effects of control-plane operations on one engine's own executions."""

    __slots__ = ("_engine",)

    def __init__(self, engine: Engine):
        self._engine = engine

    def registration(self, name: str, version: str | None) -> Workflow[Any, Any] | None:
        return self._engine.registration(name, version)

    async def run_created(self, run_id: str) -> None:
        engine = self._engine
        engine.fresh_runs[run_id] = True  # no checkpoints to read on its first turn
        if engine.drive_runs:
            engine.dispatch(run_id)
        else:
            await engine.wakes.announce("ready", run_id)

    def run_ready(self, run_id: str) -> None:
        self._engine.dispatch(run_id)

    async def redrive(self, run_id: str, cp: StepCheckpoint | None) -> None:
        await signals.redrive(self._engine, run_id, cp)

    def request_cancel(self, run_id: str) -> bool:
        execution = self._engine.executions.get(run_id)
        if execution is None:
            return False
        # A resident turn: end its waits (RunEvicted → the exit runs the unwind); a turn
        # mid-step reaches its next exit non-resident.
        execution.cancel_requested = True
        execution.evict()
        return True

    def stop(self, run_id: str) -> None:
        execution = self._engine.executions.get(run_id)
        if execution is None:
            return
        execution.cancelled = True
        execution.evict()
        # Never cancel the task asking for it (a run cancelling itself through a step).
        if execution.task is not None and execution.task is not current_task():
            execution.task.cancel()

    def run_cancelled(self, run: WorkflowRun, error: StepError) -> None:
        engine = self._engine
        engine.events.emit(
            EngineEvent(
                type="run.failed",
                run_id=run.id,
                workflow=run.workflow,
                namespace=run.namespace,
                error=error,
            )
        )
        engine.fire_cancel(run.id)

    def notify_parent(self, run: WorkflowRun, completion: dict[str, Any]) -> None:
        self._engine.notify_parent(run, completion)
