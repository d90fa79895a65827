"""durably's own serving side on Redis: step tasks from `P-tasks-<token>` to a handler, results
to `P-results`, and the liveness keys that let engines see the server.

One BullMQ worker per token (the queue is the routing token), all sharing one limit of
`concurrency` handler runs. BullMQ's concurrency is per worker, so each worker may take up to
`concurrency` jobs; past the shared limit a taken job waits (its lock is renewed meanwhile) for a
free slot rather than running. Taking a job acknowledges nothing: the job completes only after its
result was added to `P-results`, so a server that dies mid-step leaves the job `active` with a
lock that expires, and a stall check (any server's) puts it back for another server to run.

A task job that ends failed (its processing raised, or it stalled more often than allowed because
its servers kept dying) produced no result; a retryable failed result saying so is published for
it, or the engine's pending step would wait for a result that never comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from durably._core.handshake import WorkerDescriptor, descriptor_hash, descriptor_to_json
from durably._core.log_context import durably_logger
from durably._core.wire import StepResult, WireFormatError, parse_remote_task
from durably._transport.protocol import StepHandler
from durably._transport.redis_bullmq import (
    BullJob,
    BullQueue,
    BullWorker,
    WorkerTiming,
    redis_client,
)
from durably._transport.redis_plain import (
    LIVENESS_TTL_S,
    RedisNames,
    liveness_value,
)
from durably._transport.redis_results import RESULT_JOB_OPTS

log = durably_logger("durably.redis")

__all__ = ["RedisStepServer", "failed_step_payload", "is_workflow_turn"]

_PUBLISH_PATIENCE_S = 60.0
"""How long a finished step's result is retried against Redis before the job is given up as
failed (a restart or a fail-over takes seconds; turning a done step into a failure should be the
last resort)."""


def is_workflow_turn(data: object) -> bool:
    """Workers tell a workflow turn from a step task by shape alone."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("workflow"), str)
        and isinstance(data.get("history"), list)
    )


def failed_step_payload(data: object, reason: str) -> dict[str, Any] | None:
    """The result a terminally failed step job never produced, or None when the payload does not
    name a step (a turn, or a garbled job: a result nobody can match is worse than none)."""
    if not isinstance(data, dict) or is_workflow_turn(data):
        return None
    run_id, seq, step_id = data.get("runId"), data.get("seq"), data.get("stepId")
    if not isinstance(run_id, str) or not isinstance(step_id, str):
        return None
    if isinstance(seq, bool) or not isinstance(seq, (int, float)):
        return None
    return {
        "runId": run_id,
        "seq": seq,
        "stepId": step_id,
        "status": "failed",
        "error": {"message": f"remote step worker failed: {reason}", "retryable": True},
    }


class _NotAStep(Exception):
    """Raised for a job this server must not run; BullMQ then fails the job."""


class RedisStepServer:
    """Serves step tasks on a set of tokens until drained (`StepServer`)."""

    def __init__(
        self,
        *,
        url: str,
        names: RedisNames,
        tokens: Sequence[str],
        handler: StepHandler,
        concurrency: int,
        timing: WorkerTiming,
        instance_id: str,
        descriptor: WorkerDescriptor | None,
        liveness_interval_s: float,
    ):
        self.tokens = tuple(dict.fromkeys(tokens))
        self.instance_id = instance_id
        self._url = url
        self._names = names
        self._handler = handler
        self._limit = max(1, concurrency)
        self._slots = asyncio.Semaphore(self._limit)
        self._in_flight = 0
        self._timing = timing
        # Computed once: a descriptor changes only with a new process (its `startedAt`).
        self._descriptor = descriptor_to_json(descriptor) if descriptor is not None else None
        self._descriptor_hash = descriptor_hash(descriptor) if descriptor is not None else None
        self._liveness_interval = liveness_interval_s
        self._client: Redis = redis_client(url, patient=True)
        self._results = BullQueue(names.results, self._client)
        self._workers: list[BullWorker] = []
        self._bridges: set[asyncio.Task[None]] = set()
        self._liveness: asyncio.Task[None] | None = None
        self._drained = False

    async def start(self) -> None:
        for token in self.tokens:
            worker = BullWorker(
                self._names.tasks(token),
                self._process,
                url=self._url,
                concurrency=self._limit,
                timing=self._timing,
            )
            worker.on_failed(self._on_failed)
            self._workers.append(worker)
        # The first beat goes out before start returns, so an engine routing on liveness sees
        # this server at once rather than up to one interval later.
        await self._beat()
        self._liveness = asyncio.create_task(self._beat_loop(), name="redis-step-server:beat")

    @property
    def drained(self) -> bool:
        return self._drained

    @property
    def in_flight(self) -> int:
        """Handlers running now."""
        return self._in_flight

    def status(self) -> dict[str, Any]:
        """This server's status as a liveness key carries it (a `WorkerStatus`)."""
        return {
            "runtime": "python",
            "concurrency": {"mode": "fixed", "limit": self._limit},
            "inFlight": self._in_flight,
        }

    # -------------------------------------------------------------- jobs

    async def _process(self, job: BullJob) -> None:
        if is_workflow_turn(job.data):
            log.warning(
                "job %s on tokens %s is a workflow turn; this server runs steps only, so it fails",
                job.id,
                ",".join(self.tokens),
            )
            raise _NotAStep("a workflow turn reached a step server")
        try:
            task = parse_remote_task(job.data)
        except WireFormatError as exc:
            log.warning("job %s is not a step task: %s", job.id, exc)
            raise _NotAStep(str(exc)) from None
        async with self._slots:
            self._in_flight += 1
            try:
                result = await self._handler(task)
            finally:
                self._in_flight -= 1
        await self._publish(result)

    async def _publish(self, result: StepResult) -> None:
        deadline = time.monotonic() + _PUBLISH_PATIENCE_S
        pause = 0.1
        while True:
            try:
                await self._results.add("result", result.to_json(), RESULT_JOB_OPTS)
                return
            except Exception as exc:
                if time.monotonic() >= deadline:
                    raise
                log.warning("publishing the result of %s failed (%s)", result.step_id, exc)
            await asyncio.sleep(pause)
            pause = min(2.0, pause * 2)

    def _on_failed(self, job: BullJob, reason: str) -> None:
        payload = failed_step_payload(job.data, reason)
        if payload is None:
            return
        log.warning("step job %s (%s) failed: %s", job.id, payload["stepId"], reason)
        task = asyncio.create_task(self._publish_failure(payload))
        self._bridges.add(task)
        task.add_done_callback(self._bridges.discard)

    async def _publish_failure(self, payload: dict[str, Any]) -> None:
        try:
            await self._results.add("result", payload, RESULT_JOB_OPTS)
        except Exception:
            # The engine's lost-dispatch recovery is the remaining net for this step.
            log.warning("could not publish the failure of %s", payload["stepId"], exc_info=True)

    # -------------------------------------------------------------- liveness

    async def _beat(self) -> None:
        value = liveness_value(self.status(), self._descriptor_hash)
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for token in self.tokens:
                    pipe.set(
                        self._names.worker_heartbeat(token, self.instance_id),
                        value,
                        ex=LIVENESS_TTL_S,
                    )
                    if self._descriptor is not None:
                        pipe.set(
                            self._names.worker_descriptor(token, self.instance_id),
                            self._descriptor,
                            ex=LIVENESS_TTL_S,
                        )
                await pipe.execute()
        except Exception as exc:
            # A missed refresh is itself the signal (the keys expire); never stop serving for it.
            log.warning("refreshing liveness keys failed: %s", exc)

    async def _beat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._liveness_interval)
            await self._beat()

    # -------------------------------------------------------------- drain

    async def drain(self, timeout: float) -> None:
        """Stop taking tasks, give those in hand up to `timeout` seconds, then disconnect. Tasks
        still running at the deadline are abandoned and re-delivered once their locks expire."""
        if self._drained:
            return
        self._drained = True
        if self._liveness is not None:
            self._liveness.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._liveness
        for worker in self._workers:
            worker.stop_fetching()
        await asyncio.gather(*(worker.close(timeout) for worker in self._workers))
        if self._bridges:
            await asyncio.wait(set(self._bridges), timeout=5.0)
        # A drained server is gone: remove its keys now instead of letting them linger 35 s.
        keys = [self._names.worker_heartbeat(t, self.instance_id) for t in self.tokens]
        keys += [self._names.worker_descriptor(t, self.instance_id) for t in self.tokens]
        with contextlib.suppress(Exception):
            await self._client.delete(*keys)
        with contextlib.suppress(Exception):
            await self._client.aclose()
