"""A workflow's steps inside its turn: `ctx.step` (in this process, or sent to a worker over a
transport) and `ctx.local_step` / `side_effect` / `now`, each checkpointed on the running
`Execution`.

Steps run here and not in `execution.py`, which keeps what every primitive shares (the
snapshot, positions, parking and status writes); a step asks the execution for those through
its public methods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from durably._core.admission import QueueCall
from durably._core.errors import (
    RemoteStepError,
    StepFailedError,
    WorkflowBlocked,
    error_of,
)
from durably._core.log_context import durably_logger
from durably._core.models import (
    JSONValue,
    StepCheckpoint,
    StepError,
    StepEvent,
    ms_from_utc,
    replace,
    utc_from_ms,
)
from durably._engine.control.operator import redispatch_requested
from durably._engine.defs.registry import RetryPolicy, Step, step_input_json
from durably._engine.defs.step_context import StepContext
from durably._engine.defs.typed_io import PLAIN, ValueCodec
from durably._engine.run.execution import SETTLED, STEP_SCOPE, Execution
from durably._engine.run.replay_guard import REPLAY_GUARD
from durably._engine.run.step_log import attempt_scope

if TYPE_CHECKING:
    from durably._engine.run.host import RemoteDispatch

log = durably_logger("durably.engine")

__all__ = ["run_local", "run_step", "with_history"]


def with_history(
    row: StepCheckpoint, before: StepCheckpoint | None, error: StepError | None, at: int
) -> StepCheckpoint:
    """An attempt's row carrying the step's attempt history: the entries of `before` (the
    step's previous row, if any) and, when the attempt failed, its `error` (at `at`). The
    history rides on the attempt's own write: keeping it costs no extra write."""
    if before is not None and (before.attempt_errors or before.attempt_errors_omitted):
        row = replace(
            row,
            attempt_errors=before.attempt_errors,
            attempt_errors_omitted=before.attempt_errors_omitted,
        )
    return row if error is None else row.with_attempt_error(row.attempts, at, error)


async def run_step(
    ex: Execution,
    seq: int,
    name: str,
    step: Step[Any, Any] | None,
    input: Any,
    policy: RetryPolicy,
    timeout_ms: int | None,
    parallel_group: str | None = None,
    queue: QueueCall | None = None,
) -> Any:
    """ctx.step through the in-process transport, with durable retries. With `queue`,
    each attempt holds a slot of that flow-control queue while its handler runs.

    durably: the in-process transport writes ONE checkpoint per attempt (the result),
    not a `pending` row before it: the dispatching process is the executing process, so
    a crash loses both and recovery replays to the same position and runs it again.
    """
    out_codec = step.output_codec if step is not None else PLAIN
    in_codec = step.input_codec if step is not None else PLAIN
    cp = ex.snapshot.get(seq)
    ex.expect_name(seq, cp, name)
    if cp is not None and cp.status == "completed":
        return out_codec.from_json(cp.output)
    json_input = step_input_json(step, name, input)  # one input, or several as `Args`
    requires = step.requires if step is not None else ()
    remote = ex.host.remote
    if remote is not None:
        output = await _run_remote(
            ex, remote, seq, name, json_input, policy, timeout_ms, parallel_group, requires, queue
        )
        return out_codec.from_json(output)
    missing = sorted(set(requires) - set(ex.host.capabilities))
    if missing:
        # Without a transport this engine is the only worker its steps can have, so it runs
        # a step with requirements when it declares them all itself. Otherwise the run is
        # parked `blocked` and re-checked, as over a transport: another engine on the same
        # store that declares them may take the run on its re-check.
        required = ", ".join(sorted(set(requires)))
        raise WorkflowBlocked(
            f"blocked: no compatible worker (requires {required}): this engine runs steps "
            f"in-process and does not declare {', '.join(missing)} (Engine(capabilities=...)); "
            "an engine that declares them, on this store or reached over a transport, runs it",
            requires=tuple(sorted(set(requires))),
        )
    attempt = 1
    if cp is not None and cp.status == "failed":
        attempt = await _after_failed_attempt(ex, cp, policy)
    elif cp is not None:
        attempt = max(1, cp.attempts)  # a dispatch that never settled: run it again
    # Here the step's body is about to run (a recorded last failure raised above): a
    # replay stops (replay_guard.py). The replay's engine has no transport, so the remote
    # path above never runs in a replay.
    guard = REPLAY_GUARD.get()
    if guard is not None:
        await guard.new_work(ex.run_id, seq, name)
    while True:
        async with ex.host.flow.slot(ex, seq, queue):  # (waits to be admitted)
            ex.step_began()
            started = ex.now()
            ex.emit("step.started", seq=seq, name=name, kind="remote", attempt=attempt)
            try:
                with attempt_scope(ex, seq, name, attempt, "remote") as logger:
                    output, error = await ex.host.interceptors.step(
                        ex.run, seq, name, attempt, "step", ex.host.transport.execute,
                        ex, step, name, json_input, in_codec, timeout_ms, policy=policy,
                    )  # fmt: skip
            except BaseException:
                ex.step_ended()
                raise
        finished = ex.now()
        final = error is not None and (error.retryable is False or attempt >= policy.max_attempts)
        wake_at = None if error is None or final else finished + policy.delay_ms(attempt)
        row = ex.step_row(
            seq,
            name,
            "remote",
            "completed" if error is None else "failed",
            json_input,
            attempt,
            started,
            finished,
            output=output if error is None else None,
            error=error,
            wake_at=wake_at,
            parallel_group=parallel_group,
            events=logger.events or None,
        )
        row = with_history(row, ex.snapshot.get(seq), error, finished)
        try:
            # A completed step-fan member's row is never read again by a resident body
            # (its output goes straight to the fan): not keeping it holds a fan's memory
            # (and the garbage collector's work) to the members in flight.
            keep = error is not None or parallel_group is None or not ex.resident
            await ex.save(row, remember=keep)
        finally:
            ex.step_ended()  # only now: see `Execution.step_began`
        if error is None:
            ex.emit(
                "step.completed",
                seq=seq,
                name=name,
                kind="remote",
                output=output,
                duration_ms=float(finished - started),
                queue_ms=0.0,
            )
            await ex.resuspend_if_idle()
            ex.after_live_checkpoint()
            return out_codec.from_json(output)
        ex.emit(
            "step.failed",
            seq=seq,
            name=name,
            kind="remote",
            error=error,
            duration_ms=float(finished - started),
            attempt=attempt,
        )
        if final:
            await ex.resuspend_if_idle()
            raise RemoteStepError(error)
        ex.after_live_checkpoint()
        if wake_at is not None and ex.now() < wake_at:
            await ex.wait(None, wake_at)
        attempt += 1


async def _run_remote(
    ex: Execution,
    remote: RemoteDispatch,
    seq: int,
    name: str,
    json_input: JSONValue,
    policy: RetryPolicy,
    timeout_ms: int | None,
    parallel_group: str | None,
    requires: Sequence[str] = (),
    queue: QueueCall | None = None,
) -> JSONValue:
    """ctx.step over a transport: write the attempt's `pending` row, dispatch it, wait
    for the result the transport's consumer settles on that row (resident: parked in
    memory; classic: the turn suspends and the result re-drives the run).

    The row is written before the task leaves, so a result can never arrive for a row
    that does not exist; a dispatch no transport accepts turns the row into a retryable
    failure at once (retried by the policy), so nothing waits on a task that was never
    sent. `timeout_ms` bounds how long an attempt may stay unanswered; the late answer
    of a timed-out attempt finds its row no longer pending and is dropped.
    """
    cp = ex.snapshot.get(seq)
    history: StepCheckpoint | None = None  # the failed attempt before the next dispatch
    attempt = 1
    rechecks = ex.rechecks
    while True:
        if queue is not None and cp is not None and cp.status in SETTLED:
            ex.host.flow.release(ex.run_id, seq)  # the attempt is over
        if cp is not None and cp.status == "completed":
            return cp.output
        if cp is not None and cp.status == "failed":
            attempt = await _after_failed_attempt(ex, cp, policy)
            history = ex.snapshot.get(seq, cp)
            cp = None
        if cp is not None and redispatch_requested(cp):
            # An operator's `redispatch_pending` made this the next attempt: send it.
            cp = await _send_requested(ex, remote, cp, json_input)
            continue
        if cp is not None:
            # Dispatched (by this turn or an earlier one): wait for its result.
            deadline = None
            if timeout_ms is not None:
                deadline = ms_from_utc(cp.started_at) + timeout_ms
            # With the self-heal on, the wait ends at the re-dispatch time when that comes
            # before the attempt's timeout.
            heal_at = _redispatch_at(ex, cp)
            healing = heal_at is not None and (deadline is None or heal_at < deadline)
            wake = heal_at if healing else deadline
            settled = await ex.wait(
                seq, wake, accept=SETTLED, lazy_since=rechecks, also=redispatch_requested
            )
            if settled is None and healing:
                cp = await _redispatch(ex, remote, cp, json_input)
                continue
            if settled is None:
                cp = await _fail_pending(
                    ex,
                    cp,
                    StepError(
                        message=f'step "{name}" timed out after {timeout_ms}ms',
                        code="timeout",
                        # A step's own deadline counts as a TimeoutError for the policy.
                        retryable=policy.retries_exception(TimeoutError()),
                    ),
                )
            else:
                cp = settled
            continue
        # Capability routing: nothing is written for an attempt no live worker could take;
        # the run is parked `blocked` and re-checked until one appears.
        plan = await remote.blocked(ex.run, name, requires)
        if plan is not None:
            raise WorkflowBlocked(
                plan.reason,
                plan.code,
                requires=tuple(plan.requires),
                diagnostics=plan.diagnostics.to_json(),
            )
        if queue is not None:
            await ex.host.flow.acquire(ex, seq, queue)
        # From the pending row to the dispatch the step is "executing" for the turn: a turn
        # that ends meanwhile waits for the row, and a branch that outlived its turn stops
        # here (`Execution.step_began`), so no two turns ever dispatch the same attempt.
        rechecks = ex.rechecks  # a re-check wake from here on is not lost (see ex.wait)
        ex.step_began()
        try:
            cp = await _dispatch(
                ex, remote, seq, name, json_input, attempt, parallel_group, history
            )
        finally:
            ex.step_ended()


async def _dispatch(
    ex: Execution,
    remote: RemoteDispatch,
    seq: int,
    name: str,
    json_input: JSONValue,
    attempt: int,
    parallel_group: str | None,
    history: StepCheckpoint | None = None,
) -> StepCheckpoint:
    """Write an attempt's `pending` row (carrying the attempt history of `history`, the
    step's failed row before it) and send its task: the row, or the row failed (retryable)
    when no transport took the task."""
    now = ex.now()
    pending = ex.step_row(
        seq,
        name,
        "remote",
        "pending",
        json_input,
        attempt,
        now,
        now,
        parallel_group=parallel_group,
    )
    pending = with_history(pending, history, None, now)
    pending = replace(pending, worker_group=remote.token_for(ex.run, name))
    await ex.save(pending)
    ex.emit("step.started", seq=seq, name=name, kind="remote", placement="remote", attempt=attempt)
    try:
        await ex.host.interceptors.step(
            ex.run, seq, name, attempt, "dispatch",
            _send, ex, remote, seq, name, json_input, attempt,
        )  # fmt: skip
    except Exception as exc:
        log.warning("run %s: step %s could not be dispatched: %s", ex.run_id, name, exc)
        return await _fail_pending(
            ex,
            pending,
            StepError(
                message=f"remote step dispatch failed: {exc}",
                code="dispatch_failed",
                retryable=True,
            ),
        )
    return pending


async def _send(
    ex: Execution,
    remote: RemoteDispatch,
    seq: int,
    name: str,
    json_input: JSONValue,
    attempt: int,
) -> None:
    """Send one attempt's task, carrying the trace context an interceptor answers (read here,
    inside the interceptors' dispatch scope, so it names the dispatching span)."""
    traceparent = ex.host.interceptors.traceparent()
    await remote.dispatch(ex.run, seq, name, json_input, attempt, traceparent=traceparent)


async def _call_local(fn: Callable[..., Any], logger: StepContext | None) -> Any:
    """One attempt of a local step's function (awaited when it returns an awaitable)."""
    result = fn(logger) if logger is not None else fn()
    if isinstance(result, Awaitable):
        result = await result
    return result


def _redispatch_at(ex: Execution, cp: StepCheckpoint) -> int | None:
    """When the pending attempt `cp` is due to be dispatched again (`remote_redispatch_ms`
    after its last dispatch), or None when the self-heal is off. Derived from the row's
    dispatch time, so every turn and every process computes the same deadline."""
    window = ex.host.options.remote_redispatch_ms
    if window is None or cp.status != "pending":
        return None
    sent = cp.enqueued_at if cp.enqueued_at is not None else cp.started_at
    return ms_from_utc(sent) + window


async def _redispatch(
    ex: Execution, remote: RemoteDispatch, cp: StepCheckpoint, json_input: JSONValue
) -> StepCheckpoint:
    """Send a step whose answer did not come within `remote_redispatch_ms` again, under the
    same step id and as its next attempt, or fail it as lost past `remote_redispatch_max`.

    The new attempt number and dispatch time are written by compare-and-set on the pending
    row before the task leaves: an answer that lands meanwhile wins (and is returned), two
    turns cannot both re-send, and the lost dispatch's late answer, naming the old attempt,
    is dropped by the settler — so the row settles once."""
    if cp.attempts > ex.host.options.remote_redispatch_max:
        n = cp.attempts - 1
        return await _fail_pending(
            ex,
            cp,
            StepError(
                message=f'remote step "{cp.name}" lost — no result after {n} '
                f"re-dispatch{'es' if n != 1 else ''}",
                code="remote_step_lost",
                retryable=False,
            ),
        )
    now = utc_from_ms(ex.now())
    again = replace(cp, attempts=cp.attempts + 1, enqueued_at=now)
    why = f"still pending after {ex.host.options.remote_redispatch_ms} ms"
    return await _send_again(ex, remote, cp, again, json_input, why)


async def _send_requested(
    ex: Execution, remote: RemoteDispatch, cp: StepCheckpoint, json_input: JSONValue
) -> StepCheckpoint:
    """Send the attempt an operator's `redispatch_pending` wrote (already numbered), clearing
    its mark first (compare-and-set), so one request sends it once."""
    sent = replace(cp, wake_at=None, enqueued_at=utc_from_ms(ex.now()))
    return await _send_again(ex, remote, cp, sent, json_input, "redispatch requested")


async def _send_again(
    ex: Execution,
    remote: RemoteDispatch,
    cp: StepCheckpoint,
    again: StepCheckpoint,
    json_input: JSONValue,
    why: str,
) -> StepCheckpoint:
    """Write `again` over the pending row `cp` (compare-and-set: a result that landed
    meanwhile wins and is returned) and send its task as attempt `again.attempts`."""
    if not await ex.store.save_checkpoint_if_pending(again):
        fresh = await ex.store.get_checkpoint(ex.run_id, cp.seq)
        if fresh is None:
            return replace(cp, wake_at=None)  # deleted under the turn: nothing to send
        ex.snapshot[cp.seq] = fresh
        return fresh
    ex.snapshot[cp.seq] = again
    log.info(
        "run %s: step %s (seq %d) %s: re-dispatched on %s as attempt %d",
        ex.run_id,
        cp.name,
        cp.seq,
        why,
        cp.worker_group or remote.token_for(ex.run, cp.name),
        again.attempts,
    )
    try:
        await ex.host.interceptors.step(
            ex.run, cp.seq, cp.name, again.attempts, "dispatch",
            _send, ex, remote, cp.seq, cp.name, json_input, again.attempts,
        )  # fmt: skip
    except Exception as exc:
        log.warning("run %s: step %s could not be re-dispatched: %s", ex.run_id, cp.name, exc)
        return await _fail_pending(
            ex,
            again,
            StepError(
                message=f"remote step dispatch failed: {exc}",
                code="dispatch_failed",
                retryable=True,
            ),
        )
    return again


async def _fail_pending(ex: Execution, cp: StepCheckpoint, error: StepError) -> StepCheckpoint:
    """Settle a still-pending attempt as failed (compare-and-set: a result that landed
    meanwhile wins, and is returned instead)."""
    now = ex.now()
    failed = replace(cp, status="failed", error=error, finished_at=utc_from_ms(now))
    failed = failed.with_attempt_error(cp.attempts, now, error)
    if await ex.store.save_checkpoint_if_pending(failed):
        ex.snapshot[cp.seq] = failed
        ex.emit(
            "step.failed",
            seq=cp.seq,
            name=cp.name,
            kind="remote",
            placement="remote",
            error=error,
            duration_ms=float(now - ms_from_utc(cp.started_at)),
            attempt=cp.attempts,
        )
        return failed
    fresh: StepCheckpoint | None = await ex.store.get_checkpoint(ex.run_id, cp.seq)
    if fresh is None:
        return failed
    ex.snapshot[cp.seq] = fresh
    return fresh


async def _after_failed_attempt(ex: Execution, cp: StepCheckpoint, policy: RetryPolicy) -> int:
    """A recorded failed attempt of a step: its error when it was the last one the policy
    allows (or not retryable), else the wait for its retry time — stamped on the row the
    first time, so a crash does not move it — and the number of the next attempt."""
    err = cp.error or StepError(message="step failed")
    if err.retryable is False or cp.attempts >= policy.max_attempts:
        raise RemoteStepError(err)
    wake = cp.wake_at
    if wake is None:
        wake = ex.now() + policy.delay_ms(max(1, cp.attempts))
        await ex.save(replace(cp, wake_at=wake))
    if ex.now() < wake:
        await ex.wait(None, wake)
    return cp.attempts + 1


async def run_local(
    ex: Execution,
    seq: int,
    name: str,
    fn: Callable[..., Any],
    *,
    pass_logger: bool,
    policy: RetryPolicy,
    track_start: bool,
    codec: ValueCodec = PLAIN,
) -> Any:
    """ctx.local_step / side_effect / now: in-process, local retry."""
    cp = ex.snapshot.get(seq)
    ex.expect_name(seq, cp, name)
    if cp is not None and cp.status == "completed":
        return codec.from_json(cp.output)
    if cp is not None and cp.status == "failed" and cp.attempts > 0:
        # Replay of a recorded failure: raise what the live path raised (a requeue
        # resets `attempts` to 0, and then the step runs again).
        raise StepFailedError(cp.error or StepError(message=f"step {name} failed"))
    guard = REPLAY_GUARD.get()  # a replay stops here (replay_guard.py)
    if guard is not None:
        await guard.new_work(ex.run_id, seq, name)
    ex.step_began()  # ended once the result row is written: see `Execution.step_began`
    try:
        started = ex.now()
        ex.emit("step.started", seq=seq, name=name, kind="local")
        if track_start:
            await ex.save(ex.step_row(seq, name, "local", "running", None, 1, started, started))
        output, attempt, events, history = await _attempt_local(
            ex, seq, name, fn, pass_logger=pass_logger, policy=policy, codec=codec, started=started
        )
        finished = ex.now()
        row = ex.step_row(
            seq,
            name,
            "local",
            "completed",
            None,
            attempt,
            started,
            finished,
            output=output,
            events=events,
        )
        await ex.save(with_history(row, history, None, finished))
    finally:
        ex.step_ended()
    ex.emit(
        "step.completed",
        seq=seq,
        name=name,
        kind="local",
        output=output,
        duration_ms=float(finished - started),
    )
    ex.after_live_checkpoint()
    return codec.from_json(output)


async def _attempt_local(
    ex: Execution,
    seq: int,
    name: str,
    fn: Callable[..., Any],
    *,
    pass_logger: bool,
    policy: RetryPolicy,
    codec: ValueCodec,
    started: int,
) -> tuple[JSONValue, int, tuple[StepEvent, ...], StepCheckpoint | None]:
    """Run a local step's function until it succeeds (its output, the attempt that did,
    that attempt's log, and a row holding the failed attempts' history), retrying in memory
    by `policy`; the last allowed failure is written as the step's `failed` row (with the
    history) and raised as `StepFailedError`."""
    attempt = 1
    # The failed attempts so far, on a row that is never written itself: the history goes
    # out with the step's one write (its result, or its last failure).
    history: StepCheckpoint | None = None
    while True:
        token = STEP_SCOPE.set((ex, name))
        try:
            with attempt_scope(ex, seq, name, attempt, "local") as logger:
                result = await ex.host.interceptors.step(
                    ex.run, seq, name, attempt, "local",
                    _call_local, fn, logger if pass_logger else None,
                )  # fmt: skip
            return codec.to_json(result), attempt, logger.events, history
        except Exception as exc:
            finished = ex.now()
            error = error_of(exc)
            retryable = policy.retries_exception(exc)
            if not retryable and error.retryable is not False:
                error = replace(error, retryable=False)  # the policy's retry_on/dont_retry_on
            row = ex.step_row(
                seq,
                name,
                "local",
                "failed",
                None,
                attempt,
                started,
                finished,
                error=error,
                events=logger.events,
            )
            history = with_history(row, history, error, finished)
            if not retryable or attempt >= policy.max_attempts:
                await ex.save(history)
                ex.emit(
                    "step.failed",
                    seq=seq,
                    name=name,
                    kind="local",
                    error=error,
                    attempt=attempt,
                )
                raise StepFailedError(error) from exc
            delay = policy.delay_ms(attempt)
            if delay:
                await asyncio.sleep(delay / 1000.0)  # local retry backoff: not durable
            attempt += 1
        finally:
            STEP_SCOPE.reset(token)
