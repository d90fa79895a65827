"""`ResultSettler`: the transports' `ResultSink`, settling step results on their rows.

A batch of results is settled on their `pending` rows with one compare-and-set statement
(`save_checkpoints_if_pending`), so a duplicate or late result (the row is no longer pending)
writes nothing, and each run is woken at most once per batch — in memory when its body is
parked here, else through a re-drive that a step fan's join barrier may hold back while
members are still pending. A result that answers an earlier attempt than the pending one is
dropped too (`late_for`): a retry reuses the step id, so the row alone cannot tell the
attempts apart.

Results are acknowledged to the broker only after `step_results` returned, so a crash between
consuming and writing leaves the result in the broker for the next engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from durably._core.bounds import DEFAULT_MAX_PAYLOAD_BYTES
from durably._core.log_context import durably_logger
from durably._core.models import (
    TERMINAL_RUN_STATUSES,
    StepCheckpoint,
    WorkflowRun,
    ms_from_utc,
    replace,
    utc_from_ms,
)
from durably._core.wire import (
    StepResult,
)
from durably._engine.defs.events import EngineEvent, EventBus
from durably._engine.remote.steps import late_for
from durably._engine.run.children import fan_span
from durably._engine.worker.runs import ExecutingRuns

if TYPE_CHECKING:
    from durably._engine.worker.deliveries import Deliveries
    from durably._store.protocol import StateStore

log = durably_logger("durably.worker")


class ResultSettler:
    """Settles step results from any transport on their pending rows (module docstring)."""

    def __init__(
        self,
        store: StateStore,
        runs: ExecutingRuns,
        deliveries: Deliveries,
        events: EventBus,
        *,
        clock: Callable[[], int],
        release: Callable[[Sequence[str]], Awaitable[None]] | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ):
        self._store = store
        self._max_payload_bytes = max_payload_bytes
        self._runs = runs
        self._deliveries = deliveries
        self._events = events
        self._clock = clock
        # Gives back the flow-control slots of steps whose results are settled or dropped.
        self._release = release

    @property
    def max_payload_bytes(self) -> int:
        """The engine's `max_payload_bytes`: transports refuse a bigger result before parsing
        it (`result_size_limit`)."""
        return self._max_payload_bytes

    async def step_results(self, results: Sequence[StepResult]) -> None:
        by_run: dict[str, dict[str, StepResult]] = {}
        for result in results:
            # The first of two results for one step in a batch wins; the second would lose
            # the compare-and-set anyway.
            by_run.setdefault(result.run_id, {}).setdefault(result.step_id, result)
        # Runs settle concurrently; the results of one run form one batch.
        outcomes = await asyncio.gather(
            *(self._settle_run(run_id, list(batch.values())) for run_id, batch in by_run.items()),
            return_exceptions=True,
        )
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            # The transport keeps (redelivers) the whole batch; what was written is written,
            # and its duplicates then lose the compare-and-set.
            raise failures[0]

    async def _settle_run(self, run_id: str, results: list[StepResult]) -> None:
        store = self._store
        execution = self._runs.execution(run_id)
        if execution is not None and execution.resident and not execution.cancelled:
            # Driven here: the run is in memory. Were it settled elsewhere meanwhile, the
            # results are still its steps' real results, and the body's next status write
            # finds the run finished and stops.
            run: WorkflowRun | None = execution.run
        else:
            run = await store.get_run(run_id)
        if run is None:
            # Deleted, or the run of another fleet sharing this transport's queues (give
            # each fleet its own transport namespace): either way nothing here can use it.
            log.warning(
                "dropping %d result(s) for run %s, which this store does not have",
                len(results),
                run_id,
            )
            await self._free([r.step_id for r in results])
            return
        if run.status in TERMINAL_RUN_STATUSES:
            log.debug("dropping %d result(s) for run %s (finished)", len(results), run_id)
            await self._free([r.step_id for r in results])
            return
        current = await self._rows(run_id, results)
        now = self._clock()
        settled: list[StepCheckpoint] = []
        for result, row in zip(results, current, strict=True):
            if row is None or row.status not in ("pending", "running") or row.kind != "remote":
                continue  # late, duplicate or foreign: nothing to settle
            late = late_for(row, result)
            if late is not None:
                # Its slot (if any) is the pending attempt's: nothing is freed either.
                log.warning(
                    "dropping a late result for step %s (attempt %d is pending): %s",
                    result.step_id,
                    row.attempts,
                    late,
                )
                continue
            settled.append(_settled_row(row, result, now))
        if not settled:
            return
        written_flags = await store.save_checkpoints_if_pending(settled)
        written = [cp for cp, ok in zip(settled, written_flags, strict=True) if ok]
        for cp in written:
            self._emit(run, cp)
        if written:
            # Before the wake: the woken body's next queued step may want the slot at once.
            await self._free([cp.step_id for cp in written])
            await self._wake(run_id, written)

    async def _free(self, step_ids: list[str]) -> None:
        """The steps no longer run (settled here, or their run is gone): a flow-control slot
        they held is free. A duplicate that lost the compare-and-set frees nothing, so it can
        never take the slot of a newer attempt of the same step."""
        if self._release is not None:
            await self._release(step_ids)

    async def _rows(self, run_id: str, results: list[StepResult]) -> list[StepCheckpoint | None]:
        """The rows the results are for. A body parked here holds the rows it dispatched in
        memory: those need no read (a stale one only loses the compare-and-set). Otherwise one
        read per result: listing the whole run for every batch would make a wide fan's
        settlement quadratic (every batch re-reads every member)."""
        execution = self._runs.execution(run_id)
        snapshot = execution.snapshot if execution is not None else {}
        rows: list[StepCheckpoint | None] = []
        for result in results:
            row = snapshot.get(result.seq)
            if row is None or row.status not in ("pending", "running"):
                row = await self._store.get_checkpoint(run_id, result.seq)
            rows.append(row)
        return rows

    def _emit(self, run: WorkflowRun, cp: StepCheckpoint) -> None:
        started = ms_from_utc(cp.started_at)
        finished = ms_from_utc(cp.finished_at)
        enqueued = ms_from_utc(cp.enqueued_at) if cp.enqueued_at is not None else started
        if not self._events.observed:
            self._events.count_step(
                "completed" if cp.status == "completed" else "failed",
                run.workflow,
                cp.name,
                duration_ms=float(finished - started),
                error=cp.error,
            )
            return
        self._events.emit(
            EngineEvent(
                type="step.completed" if cp.status == "completed" else "step.failed",
                run_id=run.id,
                workflow=run.workflow,
                seq=cp.seq,
                name=cp.name,
                kind="remote",
                placement="remote",
                output=cp.output if cp.status == "completed" else None,
                error=cp.error,
                duration_ms=float(finished - started),
                queue_ms=float(max(0, started - enqueued)),
            )
        )

    async def _wake(self, run_id: str, written: list[StepCheckpoint]) -> None:
        execution = self._runs.execution(run_id)
        if execution is not None and execution.resident:
            for cp in written:
                execution.deliver(cp.seq, cp)  # in memory: no replay, no store work
            return
        if execution is None and await self._barrier_closed(run_id, written):
            return
        await self._deliveries.redrive(run_id, written[-1])

    async def _barrier_closed(self, run_id: str, written: list[StepCheckpoint]) -> bool:
        """A step fan's join barrier: closed (no re-drive yet) while every written row is
        completed and each touched fan still has pending members. A failed row always opens
        it (fail-fast must see it; a retry must be scheduled). A barrier that cannot be read
        counts as open: a spare re-drive replays harmlessly, a lost one strands the run."""
        spans: set[tuple[int, int]] = set()
        for cp in written:
            span = fan_span(cp.parallel_group)
            if cp.status != "completed" or span is None:
                return False
            spans.add(span)
        try:
            for lo, hi in spans:
                if await self._store.count_checkpoints(run_id, lo, hi, ["pending"]) == 0:
                    return False
        except Exception:
            return False
        return True


def _settled_row(row: StepCheckpoint, result: StepResult, now: int) -> StepCheckpoint:
    started = utc_from_ms(result.started_at) if result.started_at is not None else row.started_at
    settled = replace(
        row,
        status=result.status,
        output=result.output if result.status == "completed" else None,
        error=result.error if result.status == "failed" else None,
        events=tuple(result.events) if result.events else row.events,
        started_at=started,
        finished_at=utc_from_ms(now),
    )
    if result.status == "failed" and result.error is not None:
        # The attempt's error joins the step's history on the same write that settles it.
        settled = settled.with_attempt_error(row.attempts, now, result.error)
    return settled
