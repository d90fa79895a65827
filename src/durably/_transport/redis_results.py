"""Consuming `P-results`: step results from workers, handed to the engine in small batches.

BullMQ hands a worker one job per processor call, and the processor's return is the job's
acknowledgement (the job is then removed: producers add results with `removeOnComplete`). So each
processor call parses its job, puts the result in a shared batch and waits until the batch was
applied by `ResultSink.step_results`; only then does it return. A results worker therefore holds
up to two batches' worth of jobs at once (`concurrency = 2 × batch_size`): one batch being
applied while the next fills, which is what lets a fan of 10,000 members settle a hundred at a
time instead of one by one. A batch is cut when it is full; else at once when no batch is in the
sink (an idle engine settles a lone result without waiting: a `linger` on every result was most
of a sequential step's round trip), else `linger` after its first result; and, while every flush
slot is busy, whenever a slot frees (so a slow sink gets larger batches).

When the sink raises, the jobs must not be lost, and raising from the processor would lose them
(producers use one attempt and `removeOnFail`). So, per batch:

1. the whole batch is retried `sink_attempts` times with a growing pause (a store restart, a
   deadlock or a serialization failure clears within that);
2. then it is split in halves, each tried once, recursively, so results the sink can apply are
   not held back by one it cannot;
3. a single result that still fails is put back on `P-results` as a new job delayed by
   `requeue_delay_ms` (the result as parsed, in its wire form), and only then is its original
   job acknowledged. It comes
   back later, possibly to another engine, and is logged each time it fails: it is never dropped.
   If Redis refuses that too, the sink and the requeue are tried in turn until one works or the
   transport closes; at close the job is abandoned unacknowledged, and BullMQ's stall check
   re-delivers it once its lock expires (the results worker allows unlimited stalls for that
   reason: a result job must never be failed by stalling).

Everything on `P-results` is untrusted (any client of the Redis server can add to it), so a job
is checked before the sink sees it, and a bad one is logged once and acknowledged — never
retried, since no retry could make it usable, and never left to block the queue:

- its data is taken as the JSON text Redis holds (`BullWorker(raw_data=True)`) and measured
  before it is parsed: over the sink's `max_payload_bytes` it is never parsed;
- it must be a step result whose values the store can hold (`parse_step_result`: no `NaN`, no
  lone surrogate, no nesting too deep, numbers in range);
- a refused result that still names its step readably is replaced by its `stand_in`, a failed
  result (`result_too_large` or `invalid_result`) that fails the attempt it answered, so the run
  learns why instead of waiting; one that names nothing readable is dropped;
- a job whose stored fields BullMQ itself cannot read (`BullJob.unreadable`) is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from durably._core.bounds import DEFAULT_MAX_PAYLOAD_BYTES
from durably._core.log_context import durably_logger
from durably._core.wire import StepResult, WireFormatError, parse_step_result
from durably._transport.protocol import ResultSink
from durably._transport.redis_bullmq import BullJob, BullQueue, BullWorker, WorkerTiming

log = durably_logger("durably.redis")

__all__ = ["RESULT_JOB_OPTS", "ResultConsumer", "ResultIntake"]

RESULT_JOB_OPTS = {"removeOnComplete": True, "removeOnFail": True}
"""The options every producer of a result job uses (durable-worker included)."""

_UNLIMITED_STALLS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class ResultIntake:
    """How results are batched and retried (see the module's description)."""

    batch_size: int = 100
    linger_s: float = 0.005
    """How long a batch waits for more results while another batch is in the sink."""
    flush_slots: int = 2
    """Batches handed to the sink at once."""
    sink_attempts: int = 4
    retry_backoff_s: float = 0.1
    retry_backoff_cap_s: float = 2.0
    requeue_delay_ms: int = 5_000
    close_grace_s: float = 5.0
    """How long `close` waits for batches in the sink before abandoning their jobs."""


@dataclass(slots=True)
class _Pending:
    result: StepResult
    job: BullJob
    done: asyncio.Future[None]


class ResultConsumer:
    """The one BullMQ worker on `P-results` of a transport, feeding `sink`."""

    def __init__(
        self,
        *,
        url: str,
        queue: str,
        sink: ResultSink,
        requeue: BullQueue,
        intake: ResultIntake,
        timing: WorkerTiming,
        max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ):
        self._url = url
        self._max_bytes = max_bytes
        self._queue = queue
        self._sink = sink
        self._requeue_queue = requeue
        self._intake = intake
        self._timing = dataclasses.replace(timing, max_stalled_count=_UNLIMITED_STALLS)
        self._waiting: list[_Pending] = []
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(max(1, intake.flush_slots))
        self._flushes: set[asyncio.Task[None]] = set()
        self._collector: asyncio.Task[None] | None = None
        self._worker: BullWorker | None = None
        self._closing = False

    def start(self) -> None:
        self._collector = asyncio.create_task(self._collect(), name=f"results:{self._queue}")
        self._worker = BullWorker(
            self._queue,
            self._process,
            url=self._url,
            concurrency=2 * max(1, self._intake.batch_size),
            timing=self._timing,
            raw_data=True,
        )

    async def close(self) -> None:
        """Stop taking results; batches in the sink get `close_grace_s` to finish. Results not
        applied by then stay in Redis and are re-delivered."""
        self._closing = True
        if self._worker is not None:
            await self._worker.close(self._intake.close_grace_s)
        tasks = [t for t in (self._collector, *self._flushes) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -------------------------------------------------------------- per job

    async def _process(self, job: BullJob) -> None:
        result = self._read(job)
        if result is None:
            return  # logged; returning acknowledges (and removes) the job
        pending = _Pending(result, job, asyncio.get_running_loop().create_future())
        self._waiting.append(pending)
        self._wake.set()
        # Returning acknowledges the job, so wait until the sink applied (or requeued) it.
        await pending.done

    def _read(self, job: BullJob) -> StepResult | None:
        """The result to settle for `job`: its own, the stand-in of a refused one, or None
        (dropped). Each refusal is logged here, once, with the job's and the step's ids."""
        if job.name != "result":
            log.warning(
                "dropped job %s on %s: named %r, not 'result'", job.id, self._queue, job.name
            )
            return None
        if job.unreadable is not None:
            log.warning(
                "dropped unreadable step result: job %s on %s: %s",
                job.id,
                self._queue,
                job.unreadable,
            )
            return None
        try:
            return parse_step_result(job.data, max_bytes=self._max_bytes)
        except WireFormatError as exc:
            stand_in = exc.stand_in
            log.warning(
                "refused step result: job %s on %s, step %s: %s (%s)",
                job.id,
                self._queue,
                exc.message_id,
                exc.problem,
                "dropped" if stand_in is None else "failing the attempt it answers",
            )
            return stand_in
        except Exception as exc:  # parse_step_result raises nothing else; stay up if it does
            log.warning(
                "dropped unreadable step result: job %s on %s: %s", job.id, self._queue, exc
            )
            return None

    # -------------------------------------------------------------- batching

    async def _collect(self) -> None:
        size = max(1, self._intake.batch_size)
        while True:
            await self._wake.wait()
            if len(self._waiting) < size and self._flushes:
                # Results are arriving while a batch is in the sink: gather more of them.
                await asyncio.sleep(self._intake.linger_s)
            await self._slots.acquire()
            batch, self._waiting = self._waiting[:size], self._waiting[size:]
            batch = [p for p in batch if not p.done.done()]  # processors cancelled at close
            if not self._waiting:
                self._wake.clear()
            if not batch:
                self._slots.release()
                continue
            task = asyncio.create_task(self._flush(batch))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _flush(self, batch: list[_Pending]) -> None:
        try:
            await self._settle(batch)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not leave the jobs hanging unnoticed
            log.error("settling %d step result(s) failed", len(batch), exc_info=True)
        finally:
            self._slots.release()

    async def _apply(self, batch: Sequence[_Pending]) -> None:
        await self._sink.step_results([p.result for p in batch])
        for pending in batch:
            if not pending.done.done():
                pending.done.set_result(None)

    def _pause(self, attempt: int) -> float:
        pause = self._intake.retry_backoff_s * (4**attempt)
        return float(min(self._intake.retry_backoff_cap_s, pause))

    async def _settle(self, batch: list[_Pending]) -> None:
        attempts = max(1, self._intake.sink_attempts)
        for attempt in range(attempts):
            try:
                await self._apply(batch)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "applying %d step result(s) failed (attempt %d of %d): %s",
                    len(batch),
                    attempt + 1,
                    attempts,
                    exc,
                )
            if attempt + 1 < attempts:
                await asyncio.sleep(self._pause(attempt))
        await self._split(batch)

    async def _split(self, batch: list[_Pending]) -> None:
        if len(batch) == 1:
            await self._requeue(batch[0])
            return
        middle = len(batch) // 2
        for half in (batch[:middle], batch[middle:]):
            try:
                await self._apply(half)
            except asyncio.CancelledError:
                raise
            except Exception:
                await self._split(half)

    async def _requeue(self, pending: _Pending) -> None:
        """Put a result the sink keeps refusing back on the queue for later, then let its job
        go; if Redis refuses as well, keep trying both until one works or we close."""
        attempt = 0
        while not pending.done.done():
            try:
                await self._requeue_queue.add(
                    "result",
                    pending.result.to_json(),
                    {**RESULT_JOB_OPTS, "delay": self._intake.requeue_delay_ms},
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "could not requeue step result %s (job %s): %s",
                    pending.result.step_id,
                    pending.job.id,
                    exc,
                )
            else:
                log.warning(
                    "step result %s (job %s) was not applied; requeued for %d ms later",
                    pending.result.step_id,
                    pending.job.id,
                    self._intake.requeue_delay_ms,
                )
                pending.done.set_result(None)
                return
            if self._closing:
                return  # unacknowledged: re-delivered after its lock expires
            await asyncio.sleep(min(5.0, self._pause(attempt)))
            attempt += 1
            with contextlib.suppress(Exception):
                await self._apply([pending])
