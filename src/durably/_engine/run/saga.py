"""Compensation (sagas): the per-turn undo stack and its unwind.

The stack lives on the turn's Execution and is rebuilt by replay: `ctx.step(...,
compensate=)` and `ctx.local_step(..., compensate=)` push an entry when the step RESOLVES
(live or replayed), so the stack is in completion order and only finished steps are ever
undone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from durably._core.errors import _ControlFlow, error_of
from durably._core.log_context import durably_logger
from durably._core.models import CheckpointKind, JSONValue, StepCheckpoint, StepError
from durably._engine.control.settle import (
    SettleHost,
    release_quietly,
    run_event,
    settle_terminal,
)
from durably._engine.defs.registry import RetryPolicy, Step
from durably._engine.defs.typed_io import PLAIN
from durably._engine.defs.vocab import CANCELLED, CANCELLED_COMPLETION
from durably._engine.run.replay_guard import REPLAY_GUARD
from durably._engine.run.steps import with_history

if TYPE_CHECKING:
    from durably._engine.run.execution import Execution

log = durably_logger("durably.engine")
O = TypeVar("O")


@dataclass(frozen=True, slots=True)
class Compensation:
    """One stack entry: a local undo `fn()` or a dispatched undo step fed `args`."""

    name: str
    fn: Callable[[], Any] | None = None
    step: Step[Any, Any] | None = None
    step_name: str | None = None
    args: JSONValue = None


def stack_of(ex: Execution) -> list[Compensation]:
    stack: list[Compensation] = ex.compensations
    return stack


def push_local(ex: Execution, name: str, fn: Callable[[], Any]) -> None:
    # `{name, fn}`, pushed on completion and on replay.
    stack_of(ex).append(Compensation(name=name, fn=fn))


def push_step(ex: Execution, name: str, undo: Any, input: JSONValue, output: JSONValue) -> None:
    # `{name, dispatch: {def: undoDef, args: {input, output}}}`; the undo
    # receives ONE argument, the StepUndo envelope `{input, output}`.
    if isinstance(undo, Step):
        step: Step[Any, Any] | None = undo
        step_name = undo.name
    elif isinstance(undo, str):
        step = ex.host.step_definition(undo)
        step_name = undo
    else:
        raise TypeError(f"compensate= takes a @durably.step function or a step name, not {undo!r}")
    envelope: JSONValue = {"input": input, "output": output}
    stack_of(ex).append(Compensation(name=name, step=step, step_name=step_name, args=envelope))


async def with_step_undo(
    ex: Execution, call: Coroutine[Any, Any, O], seq: int, name: str, undo: Any
) -> O:
    value = await call
    cp = ex.snapshot.get(seq)  # the resolved row (live or replayed): its JSON input/output
    push_step(ex, name, undo, cp.input if cp else None, cp.output if cp else None)
    return value


async def with_local_undo(
    ex: Execution, call: Coroutine[Any, Any, O], name: str, undo: Callable[[], Any]
) -> O:
    value = await call
    push_local(ex, name, undo)
    return value


async def unwind(ex: Execution) -> bool:
    """Run the undos last → first at seqs -1, -2, …. Never raises for an
    undo's failure; returns False only when the store failed (the turn must then end
    unsettled and recovery re-drives it — the unwind resumes where it stopped)."""
    stack = stack_of(ex)
    try:
        for i in range(len(stack) - 1, -1, -1):
            entry = stack[i]
            seq = -(len(stack) - i)
            await _undo(ex, seq, entry)
    except (_ControlFlow, Exception) as exc:
        log.error("run %s: the saga unwind stopped (%s); it resumes on recovery", ex.run_id, exc)
        return False
    return True


async def _undo(ex: Execution, seq: int, entry: Compensation) -> None:
    name = f"compensate:{entry.name}"
    cp = ex.snapshot.get(seq)
    if cp is None:
        cp = await ex.store.get_checkpoint(ex.run_id, seq)
    # An undo already resolved (completed or exhausted-failed) is skipped,
    # so a replay of a failed, compensated run (or a crash mid-unwind) undoes nothing twice.
    if cp is not None and cp.status in ("completed", "failed"):
        return
    if entry.fn is not None:
        # Local entry: `compensation_retries` tries back to back.
        tries = max(1, ex.host.options.compensation_retries)
        kind: CheckpointKind = "local"
        json_input: JSONValue = None
        policy: RetryPolicy | None = None
    else:
        # durably: the in-process transport runs a dispatched undo like `run_step` — its
        # own decorator's retry policy (string form → engine defaults), backoff in-process,
        # one row (the result) at the negative seq.
        policy = entry.step.policy if entry.step is not None else RetryPolicy()
        tries = policy.max_attempts
        kind = "remote"
        json_input = entry.args
    guard = REPLAY_GUARD.get()  # a replay stops here (replay_guard.py)
    if guard is not None:
        await guard.new_work(ex.run_id, seq, name)
    attempt = 1
    history: StepCheckpoint | None = None  # the failed attempts, written with the result
    while True:
        started = ex.now()
        ex.emit("step.started", seq=seq, name=name, kind=kind, attempt=attempt)
        output, error = await _attempt(ex, entry)
        finished = ex.now()
        if error is None:
            row = ex.step_row(
                seq,
                name,
                kind,
                "completed",
                json_input,
                attempt,
                started,
                finished,
                output=output,
            )
            await ex.save(with_history(row, history, None, finished))
            ex.emit(
                "step.completed",
                seq=seq,
                name=name,
                kind=kind,
                output=output,
                duration_ms=float(finished - started),
            )
            return
        failed = ex.step_row(
            seq, name, kind, "failed", json_input, attempt, started, finished, error=error
        )
        history = with_history(failed, history, error, finished)
        if error.retryable is False or attempt >= tries:
            await ex.save(history)
            ex.emit("step.failed", seq=seq, name=name, kind=kind, error=error, attempt=attempt)
            return  # reported and skipped: an undo's failure never stops the unwind
        wait = policy.delay_ms(attempt) if policy is not None else 0
        if wait:
            await asyncio.sleep(wait / 1000.0)
        attempt += 1


async def _attempt(ex: Execution, entry: Compensation) -> tuple[JSONValue, StepError | None]:
    if entry.fn is None:
        name = entry.step_name or entry.name
        return await ex.host.transport.execute(ex, entry.step, name, entry.args, PLAIN, None)
    try:
        result = entry.fn()
        if isinstance(result, Awaitable):
            await result
    except Exception as exc:
        return None, error_of(exc)
    return None, None


class CancelHost(SettleHost, Protocol):
    """What a compensating cancel needs: settling, and telling this process's cancel
    listeners (the `Engine`)."""

    def fire_cancel(self, run_id: str) -> None: ...


async def compensate_and_cancel(host: CancelHost, ex: Execution) -> None:
    """Compensating cancel, at whatever exit a cancel-requested turn
    reaches: unwind, then `cancelling` → `cancelled` with `{message: 'cancelled'}` and
    `run.failed`. durably: undos run in-process, so the unwind never waits on one."""
    if not await unwind(ex):
        await release_quietly(host, ex.run_id)  # store failed: recovery re-drives
        return
    run = ex.run
    await settle_terminal(
        host,
        run,
        {"status": "cancelled", "error": CANCELLED},
        run_event("run.failed", run, error=CANCELLED),
        CANCELLED_COMPLETION,
        statuses=("cancelling",),
    )
    host.fire_cancel(run.id)
