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
- Costs of the package's Python port that dominated a remote step's round trip and a wide
  fan's CPU (measured by `benchmarks/remote.py`; `docs/remote.md` has the figures) are removed,
  with the same scripts and keys on the wire:
  - every `Job` object (one per job added and one per job fetched) built its own `Scripts`,
    which reads and hashes the package's 28 Lua files (about 0.7 ms each time); jobs now share
    one `Scripts` per connection and queue (a job only reads it);
  - the worker's loop started `concurrency` fetches at once: each wake-up sent up to
    `concurrency` `moveToActive` scripts that found nothing (dozens per job), and each turn of
    the loop waited on every task in hand (`asyncio.wait`, linear in `concurrency`). Our workers
    keep ONE fetch in flight (a fetched job starts the next fetch at once, so jobs still flow
    while earlier ones run) and learn of finished tasks from a queue;
  - completing a job also fetches the next one (the completion script's `fetchNext`, as the
    Node original does), so a busy worker runs one script per job instead of two;
  - adds made while another is on its way go out together in one pipeline (`BullQueue`), and so
    do completions made while another is on its way (`_OneFetchWorker`): a wide fan's jobs
    finish many at a time, and one round trip per job was most of both sides' CPU (the socket
    writes). A lone completion is sent at once, so a sequential step waits for nothing.
- A job whose stored fields cannot be read (its data nested deep enough to raise
  `RecursionError` in the package's `json.loads`, or not JSON at all; bytes that are not UTF-8
  are decoded into lone surrogates by the workers' clients) is handed to the processor
  with `unreadable` saying why, instead of failing the fetch: the package would leave such a job
  `active` under a lock until a stall check re-delivered it, over and over. A worker made with
  `raw_data=True` gets each job's data as the JSON text Redis holds, unparsed, so its processor
  can measure it before parsing it (what the results consumer does with `max_payload_bytes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, RedisError, TimeoutError

from durably._core.log_context import durably_logger

try:
    import bullmq.job as _bull_job  # type: ignore[import-untyped]
    from bullmq import Job as _Job
    from bullmq import Queue as _Queue
    from bullmq import Worker as _Worker
    from bullmq.custom_errors import (  # type: ignore[import-untyped]
        UnrecoverableError as _UnrecoverableError,
    )
    from bullmq.custom_errors import WaitingChildrenError as _WaitingChildrenError
    from bullmq.scripts import Scripts as _Scripts  # type: ignore[import-untyped]
    from bullmq.scripts import raw2NextJobData as _raw2NextJobData
    from bullmq.timer import Timer as _Timer  # type: ignore[import-untyped]
    from bullmq.utils import extract_result as _extract_result  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the Redis transport needs the `redis` extra: pip install 'durably[redis]'"
    ) from exc

log = durably_logger("durably.redis")

__all__ = [
    "BullJob",
    "BullQueue",
    "BullWorker",
    "Producer",
    "WorkerTiming",
    "redis_client",
]

_RETRY_ERRORS: list[type[Exception]] = [BusyLoadingError, ConnectionError, TimeoutError]


def _shared_scripts(prefix: str, queue_name: str, connection: Any) -> Any:
    """The `Scripts` of a queue on a connection, built once and kept on the connection (so it
    lives exactly as long as the connection). Jobs only read theirs; building one per job read
    the package's Lua files from disk and hashed them every time."""
    cache: dict[tuple[str, str], Any] = connection.__dict__.setdefault("_durably_scripts", {})
    scripts = cache.get((prefix, queue_name))
    if scripts is None:
        scripts = cache[(prefix, queue_name)] = _Scripts(prefix, queue_name, connection)
    return scripts


# The only name `Job.__init__` looks `Scripts` up by; queues and workers keep their own.
_bull_job.Scripts = _shared_scripts


def redis_client(url: str, *, patient: bool, lenient: bool = False) -> Redis:
    """A Redis client for BullMQ or plain keys. `patient` clients (consumers) ride out a restart
    of a few seconds; impatient ones (dispatch) fail within about a second so the caller can try
    another transport. Responses are decoded because BullMQ's scripts expect strings.

    A `lenient` client decodes bytes that are not UTF-8 into lone surrogates instead of
    raising: a worker's, so that a job someone wrote with such bytes reaches its processor,
    which refuses it (a lone surrogate is what the boundary checks refuse), instead of failing
    every fetch of it and staying `active` until a stall check hands it out again."""
    client: Redis = Redis.from_url(
        url,
        decode_responses=True,
        encoding_errors="surrogateescape" if lenient else "strict",
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 12 if patient else 3),
        retry_on_error=list(_RETRY_ERRORS),
        socket_connect_timeout=2.0,
        # Only impatient clients get a read deadline: a patient one (a worker's) blocks in
        # BZPOPMIN for up to ten seconds by design, while a hung server must not hang dispatch.
        socket_timeout=None if patient else 10.0,
    )
    return client


class Producer:
    """An impatient client (made on first use) and one `BullQueue` per queue name on it: what
    the dispatching side of a transport adds jobs through. Impatient, because a dispatch or a
    tenant's request should fail within about a second rather than hang on a dead server."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._client: Redis | None = None
        self._queues: dict[str, BullQueue] = {}

    def redis(self) -> Redis:
        if self._client is None:
            self._client = redis_client(self._url, patient=False)
        return self._client

    def queue(self, name: str) -> BullQueue:
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = BullQueue(name, self.redis())
        return queue

    async def close(self) -> None:
        """Drop the queues and close the connection (a later use opens a new one)."""
        client, self._client = self._client, None
        self._queues.clear()
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()


@dataclass(frozen=True, slots=True)
class BullJob:
    """What durably reads of a BullMQ job."""

    id: str
    name: str
    data: Any
    """The job's data: parsed JSON, or its JSON text for a worker made with `raw_data=True`."""
    failed_reason: str | None = None
    unreadable: str | None = None
    """Why the job's stored fields could not be read (then `data` is None)."""


class _UnreadableJob(_Job):  # type: ignore[misc]
    """A fetched job whose stored fields the package could not parse: no data, and why
    (`unreadable`), so that the job is still finished instead of failing the fetch."""

    def __init__(self, worker: Any, name: str, opts: dict[str, Any], unreadable: str):
        super().__init__(worker, name, None, opts)
        self.unreadable = unreadable


def _job_view(job: Any) -> BullJob:
    reason = getattr(job, "failedReason", None)
    unreadable = job.unreadable if isinstance(job, _UnreadableJob) else None
    return BullJob(
        id=str(getattr(job, "id", "") or ""),
        name=str(getattr(job, "name", "") or ""),
        data=getattr(job, "data", None),
        failed_reason=reason if isinstance(reason, str) and reason else None,
        unreadable=unreadable,
    )


_Waiting = tuple[str, Any, dict[str, Any], asyncio.Future[str]]


class BullQueue:
    """A producer on one BullMQ queue, sharing the caller's client (not closed here).

    An add made while no other is on its way goes out alone at once. Adds made while one is
    on its way wait for it and then go out together: the package's own add script for each,
    sent in one pipeline (one write and one read for up to `max_batch` jobs instead of one
    round trip each; a 10,000-member fan dispatches its steps in a few hundred). Each add
    still returns only once Redis holds its job, and fails alone if its job was refused."""

    max_batch = 500

    def __init__(self, name: str, client: Redis):
        self.name = name
        self._client = client
        self._queue = _Queue(name, {"connection": client})
        self._waiting: list[_Waiting] = []
        self._sending = False
        self._senders: set[asyncio.Task[None]] = set()

    async def add(self, job_name: str, data: Any, opts: Mapping[str, Any]) -> str:
        """Add one job; its id once Redis holds it."""
        if self._sending or self._waiting:
            future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self._waiting.append((job_name, data, dict(opts), future))
            self._send_waiting()
            return await future
        self._sending = True
        try:
            job = await self._queue.add(job_name, data, dict(opts))
        finally:
            self._sending = False
            self._send_waiting()
        return str(job.id)

    def _send_waiting(self) -> None:
        if self._waiting and not self._sending:
            self._sending = True
            task = asyncio.ensure_future(self._send_batches())
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)

    async def _send_batches(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[: self.max_batch]
                del self._waiting[: self.max_batch]
                await self._send(batch)
        finally:
            self._sending = False
            self._send_waiting()  # a batch that failed in a way we did not foresee

    async def _send(self, batch: list[_Waiting]) -> None:
        sent: list[asyncio.Future[str]] = []
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for job_name, data, opts, future in batch:
                    try:
                        job = _Job(self._queue, job_name, data, opts)
                        await self._queue.scripts.addJob(job, pipe)
                    except Exception as exc:  # this job's data or options, not the batch's
                        _settle(future, exc)
                        continue
                    sent.append(future)
                replies = await pipe.execute(raise_on_error=False) if sent else []
        except BaseException as exc:
            for future in sent:
                _settle(future, exc if isinstance(exc, Exception) else RedisError(str(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for future, reply in zip(sent, replies, strict=True):
            if isinstance(reply, Exception):
                _settle(future, reply)
            elif isinstance(reply, int) and reply < 0:
                # What the package raises for a refused add (a missing parent and the like).
                _settle(future, RedisError(f"the add script refused the job (code {reply})"))
            else:
                _settle(future, str(reply))

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


def _settle(future: asyncio.Future[str], outcome: str | Exception) -> None:
    if future.done():
        return  # its caller was cancelled meanwhile
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


JobProcessor = Callable[[BullJob], Awaitable[None]]


class _OneFetchWorker(_Worker):  # type: ignore[misc]
    """bullmq 2.17's `Worker` with its run loop replaced: one fetch in flight at a time, and
    finished tasks reported on a queue (the module's description says why). Everything else
    (fetching, locks, stall checks, completing and failing jobs) is the package's own."""

    running: bool
    # Most completions one pipeline carries.
    max_batch = 200

    def __init__(self, name: str, processor: Any, opts: dict[str, Any], *, raw_data: bool = False):
        super().__init__(name, processor, opts)
        self._durably_raw_data = raw_data
        # Completions waiting for the pipeline, and the task sending them (`_move_to_completed`).
        self._durably_completions: list[tuple[str, Any, Any, asyncio.Future[Any]]] = []
        self._durably_sender: asyncio.Task[None] | None = None

    def nextJobFromJobData(
        self,
        job_data: Any = None,
        job_id: Any = None,
        limit_until: Any = 0,
        delay_until: Any = 0,
        token: Any = None,
    ) -> Any:
        """The package's method (every fetched job passes through it), except that the data
        stays unparsed text with `raw_data`, and a job whose fields the package cannot parse
        becomes a job with no data and `unreadable` set (see the module's description)."""
        if not job_data:
            return super().nextJobFromJobData(job_data, job_id, limit_until, delay_until, token)
        raw = job_data.get("data", "{}") if self._durably_raw_data else None
        fields = {**job_data, "data": "null"} if raw is not None else job_data
        try:
            job = super().nextJobFromJobData(fields, job_id, limit_until, delay_until, token)
        except Exception as exc:  # RecursionError included: its job must still be finished
            # Removed once finished whatever its producer asked: nothing can read it, so
            # keeping it would only keep garbage (possibly a large one) in Redis.
            name = job_data.get("name")
            opts = {"removeOnComplete": True, "removeOnFail": True}
            problem = f"{type(exc).__name__}: {str(exc)[:200]}"
            job = _UnreadableJob(self, name if isinstance(name, str) else "", opts, problem)
            job.id = str(job_id or job_data.get("id") or "")
            job.token = token
            return job
        if raw is not None:
            job.data = raw
        return job

    async def _move_to_completed(
        self, job: Any, result: Any, remove: Any, token: str, fetch_next: bool
    ) -> Any:
        """The package's `moveToCompleted` (its script, keys and arguments), sent with the
        other completions made while one is on its way, in one pipeline."""
        keys, args = self.scripts.moveToCompletedArgs(job, result, remove, token, fetch_next)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._durably_completions.append((str(job.id), keys, args, future))
        if self._durably_sender is None:
            self._durably_sender = asyncio.ensure_future(self._send_completions())
        return await future

    async def _send_completions(self) -> None:
        waiting = self._durably_completions
        batch: list[tuple[str, Any, Any, asyncio.Future[Any]]] = []
        try:
            while waiting:
                batch = waiting[: self.max_batch]
                del waiting[: self.max_batch]
                await self._complete_batch(batch)
                batch = []
        except BaseException:
            # Cancelled (a forced close): nobody may wait for a reply that will not come. The
            # jobs stay active under locks that expire, so a stall check re-delivers them.
            for *_, future in batch + waiting:
                future.cancel()
            waiting.clear()
            raise
        finally:
            self._durably_sender = None

    async def _complete_batch(self, batch: list[tuple[str, Any, Any, asyncio.Future[Any]]]) -> None:
        script = self.scripts.commands["moveToFinished"]
        try:
            if len(batch) == 1:
                replies: list[Any] = [await script(keys=batch[0][1], args=batch[0][2])]
            else:
                async with self.client.pipeline(transaction=False) as pipe:
                    for _, keys, args, _future in batch:
                        await script(keys=keys, args=args, client=pipe)
                    replies = await pipe.execute(raise_on_error=False)
        except Exception as exc:
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (job_id, _, _, future), reply in zip(batch, replies, strict=True):
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            elif isinstance(reply, int) and reply < 0:
                # What the package raises for a refused completion (a lost lock and the like).
                future.set_exception(
                    self.scripts.finishedErrors(
                        {
                            "code": reply,
                            "jobId": job_id,
                            "command": "moveToFinished",
                            "state": "active",
                        }
                    )
                )
            else:
                future.set_result(_raw2NextJobData(reply) if reply is not None else None)

    async def run(self) -> None:
        if self.running:
            raise RuntimeError("Worker is already running")
        self.timer = _Timer(self.opts["lockDuration"] / 2 / 1000, self.extendLocks, self.emit)
        self.stalledCheckTimer = _Timer(
            self.opts["stalledInterval"] / 1000, self.runStalledJobsCheck, self.emit
        )
        self.running = True
        with contextlib.suppress(Exception):
            # What the package's Node original does at start and this port never does: learn
            # the server's version. From Redis 6 a blocking fetch may wait a fraction of a
            # second, so a delayed job (a requeued result) is fetched when due, not at the
            # next whole second.
            await self.blockingRedisConnection.getRedisVersion()
        limit = int(self.opts["concurrency"])
        retry = {"delay_in_ms": self.opts["runRetryDelay"], "only_emit_error": True}
        finished: asyncio.Queue[asyncio.Future[Any]] = asyncio.Queue()
        fetch: asyncio.Future[Any] | None = None
        serial = 0
        try:
            while not self.closed:
                # `processing` holds the fetch and the jobs in hand (the package's `close`
                # cancels what it holds); a new fetch starts only while a job slot is free.
                if fetch is None and not self.closing and len(self.processing) < limit:
                    serial += 1
                    next_job = functools.partial(self.getNextJob, f"{self.id}:{serial}")
                    fetch = asyncio.ensure_future(self.retryIfFailed(next_job, retry))
                    self.processing.add(fetch)
                    fetch.add_done_callback(finished.put_nowait)
                if not self.processing:
                    break  # closing, and nothing in hand
                task = await finished.get()
                self.processing.discard(task)
                if task.cancelled():
                    if task is fetch:
                        fetch = None
                    continue
                if task is fetch:
                    fetch = None
                # A fetch yields a job; so does a finished job (the next one, fetched by the
                # script that completed it).
                outcome = _extract_result(task, self.emit)  # logs what a task raised
                if outcome is not None:
                    job = asyncio.ensure_future(self._process_job(outcome, outcome.token))
                    self.processing.add(job)
                    job.add_done_callback(finished.put_nowait)
        finally:
            self.running = False
            self.timer.stop()
            self.stalledCheckTimer.stop()

    async def _process_job(self, job: Any, token: str) -> Any:
        """The package's `processJob`, except that completing a job also fetches the next
        one (the completion script's `fetchNext`, which the package's Node original uses and
        this port leaves off): one script per job instead of two while jobs keep coming.
        Returns the next job, or None."""
        next_job = None
        try:
            if job.deferredFailure:
                failure = _UnrecoverableError(job.deferredFailure)
                await job.moveToFailed(failure, token)
                self.emit("failed", job, failure)
                return None
            self.jobs.add((job, token))
            result = await self.processor(job, token)
            if not self.forceClosing:
                remove = job.opts.get("removeOnComplete", False)
                fetch_next = not self.closing
                raw = await self._move_to_completed(job, result, remove, token, fetch_next)
                if raw and raw[0]:  # a job came with it (else: none waiting, or a delay)
                    next_job = self.nextJobFromJobData(raw[0], raw[1], 0, 0, token)
                job.returnvalue = result
                job.attemptsMade = job.attemptsMade + 1
            self.emit("completed", job, result)
        except _WaitingChildrenError:
            return None
        except Exception as err:
            try:
                if not self.forceClosing:
                    await job.moveToFailed(err, token)
                self.emit("failed", job, err)
            except Exception as err2:
                self.emit("error", err2, job)
        finally:
            self.jobs.discard((job, token))
        return next_job


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
        raw_data: bool = False,
    ):
        self.queue = queue
        self._processor = processor
        # A client of its own, closed with the worker; BullMQ uses it for both the blocking
        # fetch and the bookkeeping (its pool hands each a separate connection).
        client = redis_client(url, patient=True, lenient=True)

        async def process(job: Any, _token: str) -> None:
            await processor(_job_view(job))

        self._worker = _OneFetchWorker(
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
            raw_data=raw_data,
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
