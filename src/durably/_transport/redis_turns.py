"""Remote workflow turns on Redis: WorkflowTasks out, decisions and step events back.

- A turn goes to `P-tasks-<token>` as a BullMQ job named `workflow` (the queue its workflow
  workers consume; the SDK tells a turn from a step by its shape: `workflow` a string and
  `history` a list), with `removeOnComplete` and `removeOnFail` and the broker priority when
  the run has one.
- Decisions come back on `P-decisions` (job `decision`) and live local-step events on
  `P-step-events` (job `stepEvent`); each job is handed to the engine's `TurnSink` and
  acknowledged only after the sink returned. Producers add them with one attempt and
  `removeOnFail`, so a job whose processor raised would be lost: a sink failure is retried
  with a growing pause, and a job that still fails is put back on its queue delayed, up to
  `_MAX_REQUEUES` times (a few minutes of store outage); after that it is logged with its id
  and dropped, so a message that can never be applied is not retried forever. Losing one
  costs no durable fact: a decision's run is issued a new turn at its liveness wake, a step
  event is only the live view. A decision the engine cannot use (stale, malformed) is the
  sink's to drop.
- Run heartbeats arrive on the `P-heartbeat` pub/sub channel and are handed over as they come
  (a lost beat costs nothing: the next one comes within seconds, and the liveness wake covers
  a silence).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from durably._core.log_context import durably_logger
from durably._core.wire import to_broker_priority
from durably._transport.protocol import TurnSink
from durably._transport.redis_bullmq import BullJob, BullQueue, BullWorker, WorkerTiming
from durably._transport.redis_plain import RedisNames, RunBeat

log = durably_logger("durably.redis")

__all__ = ["TURN_JOB_OPTS", "RedisTurns"]

TURN_JOB_OPTS = {"removeOnComplete": True, "removeOnFail": True}
"""The options of a workflow-turn job (durable-worker's own choice for turns)."""

_REPLY_JOB_OPTS = {"removeOnComplete": True, "removeOnFail": True}
_SINK_ATTEMPTS = 5
_REQUEUE_DELAY_MS = 2_000
_MAX_REQUEUES = 30
# How often a job was put back, carried in its data (the sink never sees it).
_REQUEUE_KEY = "durablyRequeues"
_UNLIMITED_STALLS = 1_000_000_000


class RedisTurns:
    """The workflow-turn channel of one `RedisTransport` (`TurnChannel`)."""

    def __init__(
        self,
        *,
        url: str,
        names: RedisNames,
        timing: WorkerTiming,
        queue: Callable[[str], BullQueue],
        check_token: Callable[[str], None],
        subscribe_beats: Callable[[Callable[[RunBeat], Awaitable[None] | None]], Awaitable[Any]],
    ):
        self._url = url
        self._names = names
        # A decision job must never be failed for stalling: its worker re-delivers instead.
        self._timing = dataclasses.replace(timing, max_stalled_count=_UNLIMITED_STALLS)
        self._queue = queue
        self._check_token = check_token
        self._subscribe_beats = subscribe_beats
        self._workers: list[BullWorker] = []
        self._sink: TurnSink | None = None

    @property
    def decisions_queue(self) -> str:
        return f"{self._names.prefix}-decisions"

    @property
    def step_events_queue(self) -> str:
        return f"{self._names.prefix}-step-events"

    async def dispatch_turn(self, task: dict[str, object], *, token: str) -> None:
        self._check_token(token)
        opts: dict[str, Any] = dict(TURN_JOB_OPTS)
        raw_priority = task.get("priority")
        if isinstance(raw_priority, (int, float)) and not isinstance(raw_priority, bool):
            priority = to_broker_priority(raw_priority)
            if priority is not None:
                opts["priority"] = priority
        await self._queue(self._names.tasks(token)).add("workflow", task, opts)

    async def start_turns(self, sink: TurnSink) -> None:
        if self._sink is not None:
            return
        self._sink = sink
        self._workers = [
            BullWorker(
                self.decisions_queue,
                self._consumer("decision", self.decisions_queue, sink.decisions),
                url=self._url,
                concurrency=16,
                timing=self._timing,
            ),
            BullWorker(
                self.step_events_queue,
                self._consumer("stepEvent", self.step_events_queue, sink.step_events),
                url=self._url,
                concurrency=16,
                timing=self._timing,
            ),
        ]
        await self._subscribe_beats(self._on_beat)

    def _on_beat(self, beat: RunBeat) -> Awaitable[None] | None:
        sink = self._sink
        if sink is None or beat.step_id is not None:
            return None  # a step's beat is not a turn's business
        return sink.run_heartbeats([{"runId": beat.run_id, "seq": beat.seq, "group": beat.group}])

    def _consumer(
        self,
        job_name: str,
        queue: str,
        apply: Callable[[Sequence[dict[str, object]]], Awaitable[None]],
    ) -> Callable[[BullJob], Awaitable[None]]:
        async def process(job: BullJob) -> None:
            if job.name != job_name or not isinstance(job.data, dict):
                log.warning("dropped job %s on %s: not a %s", job.id, queue, job_name)
                return
            data = dict(job.data)
            requeues = data.pop(_REQUEUE_KEY, 0)
            if isinstance(requeues, bool) or not isinstance(requeues, int) or requeues < 0:
                requeues = _MAX_REQUEUES  # forged: never requeue it
            pause = 0.05
            for attempt in range(1, _SINK_ATTEMPTS + 1):
                try:
                    await apply([data])
                    return
                except Exception as exc:
                    log.warning(
                        "applying %s job %s failed (attempt %d): %s", job_name, job.id, attempt, exc
                    )
                    await asyncio.sleep(pause)
                    pause = min(2.0, pause * 2)
            if requeues >= _MAX_REQUEUES:
                log.error(
                    "dropped %s job %s on %s: still failing after %d requeues",
                    job_name,
                    job.id,
                    queue,
                    requeues,
                )
                return
            # Still failing: put it back, delayed, before acknowledging this delivery.
            opts = {**_REPLY_JOB_OPTS, "delay": _REQUEUE_DELAY_MS}
            await self._queue(queue).add(job_name, {**data, _REQUEUE_KEY: requeues + 1}, opts)

        return process

    async def close(self, grace_s: float) -> None:
        workers, self._workers = self._workers, []
        for worker in workers:
            with contextlib.suppress(Exception):
                await worker.close(grace_s)
        self._sink = None
