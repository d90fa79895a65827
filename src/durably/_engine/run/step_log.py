"""The scope of one step attempt run by a turn: its `StepContext` (the step logger, streamed
live as `step.progress`) and the run context of log records logged inside."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from durably._core.log_context import step_logging
from durably._core.models import StepEvent
from durably._engine.defs.step_context import StepContext, step_scope
from durably._engine.run.execution import Execution

__all__ = ["attempt_scope", "served_attempt"]


@contextmanager
def attempt_scope(
    ex: Execution, seq: int, name: str, attempt: int, kind: str
) -> Iterator[StepContext]:
    """Inside: `current_step()` is this attempt's context and records carry its step and
    seq. Its `events` are what the attempt's row keeps."""

    def progress(event: StepEvent) -> None:
        ex.emit("step.progress", seq=seq, name=name, kind=kind, attempt=attempt, event=event)

    step = StepContext(
        ex.run_id,
        seq,
        name,
        attempt,
        workflow=ex.run.workflow,
        clock=ex.host.clock,
        on_event=progress,
    )
    with step_logging(ex.run_id, ex.run.workflow, name, seq), step_scope(step):
        yield step


@contextmanager
def served_attempt(run_id: str, seq: int, name: str, attempt: int) -> Iterator[StepContext]:
    """The same for an attempt this process serves for another engine (a task from a
    transport): its events go back on the result."""
    step = StepContext(run_id, seq, name, attempt)
    with step_logging(run_id, None, name, seq), step_scope(step):
        yield step
