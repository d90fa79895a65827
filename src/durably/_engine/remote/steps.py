"""Steps over a transport: dispatching them, settling their results, serving them.

- `RemoteSteps` sends a step attempt to the workers serving its name. The routing token is
  the step's name made a queue token, suffixed with the run's namespace when it is not the
  default one (`tenant_group(sanitize(name), run.namespace)`), so a tenant's steps reach only
  the workers of its partition.
- `ResultSettler` is the transports' `ResultSink`: it settles a batch of results on their
  `pending` rows with one compare-and-set statement (`save_checkpoints_if_pending`), so a
  duplicate or late result (the row is no longer pending) writes nothing, and wakes each run at
  most once per batch — in memory when its body is parked here, else through a re-drive that
  a step fan's join barrier may hold back while members are still pending. A result that
  answers an earlier attempt than the pending one is dropped too (`late_for`): a retry reuses
  the step id, so the row alone cannot tell the attempts apart.
- `StepService` is the handler of a process that serves steps (a `durably worker`, or an
  engine serving its own steps): it runs the registered handler and answers with a result.

Results are acknowledged to the broker only after `step_results` returned, so a crash between
consuming and writing leaves the result in the broker for the next engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from durably._core.handshake import (
    BlockCode,
    DispatchBlocked,
    DispatchDiagnostics,
    WorkerDescriptor,
    normalize_descriptor,
    plan_dispatch,
)
from durably._core.log_context import durably_logger
from durably._core.models import (
    JSONValue,
    StepCheckpoint,
    StepError,
    StepEvent,
    WorkflowRun,
    ms_from_utc,
    replace,
)
from durably._core.wire import (
    RemoteTask,
    StepResult,
    WireFormatError,
    sanitize_queue_token,
    step_id_of,
    tenant_group,
)
from durably._engine.defs.intercept import NO_INTERCEPTORS, Interceptors
from durably._engine.defs.registry import Step
from durably._engine.defs.typed_io import PLAIN
from durably._engine.run.in_process import run_handler
from durably._engine.run.step_log import served_attempt

if TYPE_CHECKING:
    from durably._transport.pool import TransportPool

log = durably_logger("durably.remote")

__all__ = [
    "LATE_RESULT_SKEW_MS",
    "RemoteSteps",
    "StepService",
    "late_for",
    "step_token",
]

# How long a read of the live workers' descriptors on a token is reused.
_DIRECTORY_TTL_S = 1.0

LATE_RESULT_SKEW_MS = 1_000
"""How far a worker's clock may run behind the engine's before a result of a retry, judged by
its `startedAt`, is taken for a late answer of an earlier attempt (see `late_for`)."""


def late_for(row: StepCheckpoint, result: StepResult) -> str | None:
    """Why `result` answers an earlier attempt than the one `row` (pending) waits for, or None
    when it may settle it. A retry reuses the step id, so the rule uses what results carry:

    - a result that names its attempt (durably's own workers send `attempt`) settles only that
      attempt;
    - else, on a retry (attempt 2 or later), a result whose worker picked the task up
      (`startedAt`) more than `LATE_RESULT_SKEW_MS` before this attempt was dispatched answers
      an earlier one: a task cannot be picked up before it was sent;
    - else (a first attempt, or a result without `startedAt`) it settles the pending attempt.

    The limits: the time rule trusts the worker's clock to within `LATE_RESULT_SKEW_MS`, so a
    worker running further behind has its answers to retries dropped (the attempt then waits
    for its timeout); and an earlier attempt's task that waited in the queue until after the
    retry was sent answers like the retry (it is the same step with the same input)."""
    if result.attempt is not None:
        if result.attempt == row.attempts:
            return None
        return f"it answers attempt {result.attempt}, not attempt {row.attempts}"
    if row.attempts <= 1 or result.started_at is None:
        return None
    dispatched = ms_from_utc(row.enqueued_at if row.enqueued_at is not None else row.started_at)
    if result.started_at < dispatched - LATE_RESULT_SKEW_MS:
        return (
            f"its worker started it {dispatched - result.started_at} ms before attempt "
            f"{row.attempts} was dispatched"
        )
    return None


def _blocked_without_workers(
    token: str, required: tuple[str, ...], cp: WorkerDescriptor
) -> DispatchBlocked:
    code: BlockCode = "capability.unavailable"
    return DispatchBlocked(
        code=code,
        reason=f"blocked: no compatible worker (requires {', '.join(required)}): no live "
        f"worker serves {token}",
        requires=required,
        diagnostics=DispatchDiagnostics(
            code=code,
            token=token,
            requires=required,
            live_workers=0,
            control_plane=cp,
            workers=(),
            missing_capabilities=required,
        ),
    )


def _blocked_without_directory(
    token: str, required: tuple[str, ...], cp: WorkerDescriptor
) -> DispatchBlocked:
    blocked = _blocked_without_workers(token, required, cp)
    return replace(
        blocked,
        reason=f"blocked: no compatible worker (requires {', '.join(required)}): steps with "
        "requirements go to workers that declare capabilities, which this engine can see "
        "only over a transport that carries worker descriptors (Redis)",
    )


def step_token(name: str, namespace: str | None) -> str:
    """The routing token of step `name` for a run in `namespace`."""
    return tenant_group(sanitize_queue_token(name), namespace)


class RemoteSteps:
    """Dispatches step attempts through the engine's transport pool, and checks that some
    live worker offers what a step requires before it is dispatched (capability routing)."""

    def __init__(self, pool: TransportPool, *, control_plane: WorkerDescriptor):
        self._pool = pool
        self._control_plane = control_plane
        self._cache: dict[str, tuple[float, list[WorkerDescriptor] | None]] = {}

    async def blocked(self, run: WorkflowRun, name: str, requires: Sequence[str]) -> Any:
        """Why a step requiring `requires` cannot be dispatched now (a `DispatchBlocked`), or
        None when some live worker on its token offers all of it. Nothing is required →
        nothing is checked. A requirement no worker can be asked about (no transport of this
        engine carries descriptors) blocks: it could never be honoured."""
        if not requires:
            return None
        token = self.token_for(run, name)
        live = await self._descriptors(token)
        required = tuple(sorted(set(requires)))
        if live is None:
            return _blocked_without_directory(token, required, self._control_plane)
        if not live:
            return _blocked_without_workers(token, required, self._control_plane)
        plan = plan_dispatch(required, live, self._control_plane, token)
        return plan if isinstance(plan, DispatchBlocked) else None

    async def _descriptors(self, token: str) -> list[WorkerDescriptor] | None:
        """The live descriptors on `token` across the pool (None: no member has a worker
        directory). Cached for a second: a fan of steps with requirements asks once, not once
        per member."""
        now = time.monotonic()
        hit = self._cache.get(token)
        if hit is not None and now - hit[0] < _DIRECTORY_TTL_S:
            return hit[1]
        found: list[WorkerDescriptor] | None = None
        for _, member in self._pool.members:
            directory = member.directory
            if directory is None:
                continue
            found = found if found is not None else []
            for raw in await directory.read_worker_descriptors(token):
                try:
                    found.append(normalize_descriptor(raw))
                except WireFormatError as exc:
                    log.warning("skipped a garbled worker descriptor on %s: %s", token, exc)
        self._cache[token] = (now, found)
        return found

    def token_for(self, run: WorkflowRun, name: str) -> str:
        return step_token(name, run.namespace)

    async def dispatch(
        self,
        run: WorkflowRun,
        seq: int,
        name: str,
        json_input: JSONValue,
        attempt: int,
        *,
        traceparent: str | None = None,
    ) -> None:
        task = RemoteTask(
            run_id=run.id,
            seq=seq,
            name=name,
            step_id=step_id_of(run.id, seq),
            group=self.token_for(run, name),
            input=json_input,
            attempt=attempt,
            priority=run.priority,
            traceparent=traceparent,
        )
        await self._pool.dispatch(task)


class StepService:
    """Runs the steps a process serves: the handler registered under the task's name."""

    def __init__(
        self,
        steps: Callable[[str], Step[Any, Any] | None],
        executor: Callable[[], ThreadPoolExecutor],
        *,
        interceptors: Interceptors = NO_INTERCEPTORS,
        namespace: str | None = None,
    ):
        self._steps = steps
        self._executor = executor
        self._interceptors = interceptors
        self._namespace = namespace

    async def __call__(self, task: RemoteTask) -> StepResult:
        started = int(time.time() * 1000)
        step = self._steps(task.name)
        events: tuple[StepEvent, ...] = ()
        if step is None:
            output: JSONValue = None
            error: StepError | None = StepError(
                message=f"no handler for {task.name}", retryable=False
            )
        else:
            with served_attempt(task.run_id, task.seq, task.name, task.attempt) as logger:
                output, error = await self._interceptors.served(
                    task, self._namespace, run_handler,
                    step, task.name, task.input, step.input_codec or PLAIN, None, self._executor(),
                )  # fmt: skip
            events = logger.events
        return StepResult(
            run_id=task.run_id,
            seq=task.seq,
            step_id=task.step_id,
            status="completed" if error is None else "failed",
            output=output,
            error=error,
            started_at=started,
            attempt=task.attempt,
            events=events,
        )
