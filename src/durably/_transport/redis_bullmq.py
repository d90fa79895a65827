"""A small typed layer over the `bullmq` package (which ships no type information).

Every BullMQ key durably touches goes through `bullmq.Queue` and `bullmq.Worker`, never through
hand-written commands, because the job protocol (Lua scripts, lock and stall bookkeeping) must
stay exactly the one `durable-worker` speaks. This module is the only one that imports `bullmq`;
the rest of the Redis transport sees `BullQueue`, `BullWorker` and `BullJob` with real types.

What it adds to the package, and why:

- Redis clients are built here (`redis_client`) with a bounded retry policy and handed to BullMQ
  as ready instances: given a URL, BullMQ builds clients that retry a dead server for minutes
  (twenty tries, backoff capped at 20 s), so a dispatch to a stopped Redis would hang instead of
  failing over to another transport.
- Workers are started with `autorun` off and run in a task this module keeps, so the consuming
  loop cannot be garbage-collected and its exit is logged.
- `BullWorker.close(grace)` stops fetching, waits for the jobs in hand, then force-closes and
  stops BullMQ's lock and stall timers, which the package leaves running when its loop ends by
  cancellation. A job still in hand at the deadline stays `active` with a lock that expires, so
  another worker's stall check re-delivers it: nothing is acknowledged that was not finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

try:
    from bullmq import Queue as _Queue  # type: ignore[import-untyped]
    from bullmq import Worker as _Worker
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the Redis transport needs the `redis` extra: pip install 'durably[redis]'"
    ) from exc

log = logging.getLogger("durably.redis")

__all__ = [
    "BullJob",
    "BullQueue",
    "BullWorker",
    "WorkerTiming",
    "redis_client",
]

_RETRY_ERRORS: list[type[Exception]] = [BusyLoadingError, ConnectionError, TimeoutError]


def redis_client(url: str, *, patient: bool) -> Redis:
    """A Redis client for BullMQ or plain keys. `patient` clients (consumers) ride out a restart
    of a few seconds; impatient ones (dispatch) fail within about a second so the caller can try
    another transport. Responses are decoded because BullMQ's scripts expect strings."""
    client: Redis = Redis.from_url(
        url,
        decode_responses=True,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 12 if patient else 3),
        retry_on_error=list(_RETRY_ERRORS),
        socket_connect_timeout=2.0,
        # Only impatient clients get a read deadline: a patient one (a worker's) blocks in
        # BZPOPMIN for up to ten seconds by design, while a hung server must not hang dispatch.
        socket_timeout=None if patient else 10.0,
    )
    return client


@dataclass(frozen=True, slots=True)
class BullJob:
    """What durably reads of a BullMQ job."""

    id: str
    name: str
    data: Any
    failed_reason: str | None = None


def _job_view(job: Any) -> BullJob:
    reason = getattr(job, "failedReason", None)
    return BullJob(
        id=str(getattr(job, "id", "") or ""),
        name=str(getattr(job, "name", "") or ""),
        data=getattr(job, "data", None),
        failed_reason=reason if isinstance(reason, str) and reason else None,
    )


class BullQueue:
    """A producer on one BullMQ queue, sharing the caller's client (not closed here)."""

    def __init__(self, name: str, client: Redis):
        self.name = name
        self._queue = _Queue(name, {"connection": client})

    async def add(self, job_name: str, data: Any, opts: Mapping[str, Any]) -> str:
        """Add one job; its id once Redis holds it."""
        job = await self._queue.add(job_name, data, dict(opts))
        return str(job.id)

    async def counts(self, *states: str) -> dict[str, int]:
        """Job counts by state (`waiting` includes `paused`)."""
        raw = await self._queue.getJobCounts(*states)
        return {str(state): int(count or 0) for state, count in raw.items()}


@dataclass(frozen=True, slots=True)
class WorkerTiming:
    """BullMQ worker timings. The defaults are BullMQ's own (and durable-worker's), except the
    retry delay after a lost connection, shortened from 15 s so a consumer resumes soon after a
    Redis restart; tests shorten the lock and stall intervals to see re-delivery quickly."""

    lock_duration_ms: int = 30_000
    """How long a job's lock lives without renewal (renewed every half of it)."""
    stalled_interval_ms: int = 30_000
    """How often a worker looks for jobs whose lock expired (their worker died)."""
    max_stalled_count: int = 1
    """How often a job may stall before it is failed instead of re-delivered."""
    drain_delay_s: float = 5.0
    """How long an idle worker blocks waiting for a job before asking again."""
    run_retry_delay_ms: int = 1_000
    """Pause before fetching again after the connection failed."""


JobProcessor = Callable[[BullJob], Awaitable[None]]


class BullWorker:
    """One BullMQ worker consuming `queue` with `processor`, `concurrency` jobs at a time, on a
    Redis client of its own.

    The processor's return is the acknowledgement: BullMQ completes the job after it returns and
    fails it if it raises (then the job's own `removeOnFail` applies)."""

    def __init__(
        self,
        queue: str,
        processor: JobProcessor,
        *,
        url: str,
        concurrency: int,
        timing: WorkerTiming,
    ):
        self.queue = queue
        self._processor = processor
        # A client of its own, closed with the worker; BullMQ uses it for both the blocking
        # fetch and the bookkeeping (its pool hands each a separate connection).
        client = redis_client(url, patient=True)

        async def process(job: Any, _token: str) -> None:
            await processor(_job_view(job))

        self._worker = _Worker(
            queue,
            process,
            {
                "connection": client,
                "concurrency": max(1, concurrency),
                "autorun": False,
                "lockDuration": timing.lock_duration_ms,
                "stalledInterval": timing.stalled_interval_ms,
                "maxStalledCount": timing.max_stalled_count,
                "drainDelay": timing.drain_delay_s,
                "runRetryDelay": timing.run_retry_delay_ms,
            },
        )
        self._worker.on("error", self._on_error)
        self._run = asyncio.create_task(self._run_loop(), name=f"bullmq-worker:{queue}")
        self._closed = False

    async def _run_loop(self) -> None:
        try:
            await self._worker.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.error("the BullMQ worker on %s stopped", self.queue, exc_info=True)
            return
        if not self._worker.closing:
            log.error("the BullMQ worker on %s stopped on its own", self.queue)

    def _on_error(self, err: object, *_rest: object) -> None:
        # BullMQ reports fetch and bookkeeping errors here (it retries them itself).
        log.warning("BullMQ worker on %s: %s", self.queue, err)

    def on_failed(self, callback: Callable[[BullJob, str], None]) -> None:
        """Call `callback(job, reason)` when a job of this worker ends failed: its processor
        raised, or it stalled more often than allowed. Called synchronously by BullMQ, so the
        callback must not block and must not raise (this wrapper swallows what it raises)."""

        def handle(job: Any = None, error: Any = None, *_extra: Any) -> None:
            try:
                if job is None:
                    return
                view = _job_view(job)
                reason = view.failed_reason or (str(error) if error else "") or "unknown"
                callback(view, reason)
            except Exception:
                log.warning("failed-job listener on %s raised", self.queue, exc_info=True)

        self._worker.on("failed", handle)

    @property
    def in_hand(self) -> int:
        """Jobs taken and not yet finished (processing or being acknowledged)."""
        return len(self._worker.jobs)

    def stop_fetching(self) -> None:
        """Take no new job; those in hand go on."""
        self._worker.closing = True

    async def close(self, grace: float) -> None:
        """Stop fetching, wait up to `grace` seconds for the jobs in hand, then disconnect.
        Jobs still in hand at the deadline are abandoned: their locks expire and a stall check
        re-delivers them."""
        if self._closed:
            return
        self.stop_fetching()
        deadline = time.monotonic() + max(0.0, grace)
        # BullMQ signals nothing when its set of jobs in hand empties, so look at it.
        while self.in_hand and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if self.in_hand:
            log.warning(
                "%d job(s) on %s still running at close; they will be re-delivered",
                self.in_hand,
                self.queue,
            )
        self._closed = True
        # Force: BullMQ's graceful close also waits for its blocked fetch (up to the drain
        # delay) and misses jobs fetched after it was called; the jobs we care about are done.
        with contextlib.suppress(Exception):
            await self._worker.close(force=True)
        self._run.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._run
        # A loop ended by cancellation leaves BullMQ's lock and stall timers running.
        for name in ("timer", "stalledCheckTimer"):
            timer = getattr(self._worker, name, None)
            if timer is not None:
                timer.stop()
