"""The tenant gateway's messages on Redis: start-run requests, run requests and their replies,
and tenant events, under the same names and job shapes `durable-worker` and the TypeScript
gateway use.

- `P-start-run` (BullMQ queue, job `startRun`): a store-less process asks the control plane to
  start a run. Producers add it with one attempt and `removeOnFail`, so a job whose processor
  raised would be lost: like the turn consumers, a handler failure (a store that is down) is
  retried here with a growing pause, and a job that still fails is put back on its queue
  delayed before this delivery is acknowledged. The job is never dropped for a failure of ours.
- `P-run-request` (queue, job `runRequest`): one read or control verb from a tenant. The
  handler's answer is published on `P-run-reply` (pub/sub, shared by every tenant: each one
  keeps the replies whose `requestId` it is waiting for).
- `P-tenant-events-<tenant>` (pub/sub): engine events of the runs in a tenant's namespace.

This module only moves JSON objects; what a message means, and who may ask what, is decided by
the engine's gateway (`durably._engine.gateway.server`). One object serves both ends: the control
plane calls `serve`, `publish_reply` and `publish_tenant_event`; a tenant calls `start_run`,
`send_request`, `subscribe_replies` and `subscribe_tenant_events`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from durably._core.log_context import durably_logger
from durably._core.wire import effective_prefix
from durably._transport.protocol import TransportUnavailableError
from durably._transport.redis_bullmq import (
    BullJob,
    BullQueue,
    BullWorker,
    Producer,
    WorkerTiming,
)
from durably._transport.redis_plain import ChannelSubscription, open_subscription

if TYPE_CHECKING:
    from durably._transport.redis import RedisTransport

log = durably_logger("durably.redis")

__all__ = ["GATEWAY_JOB_OPTS", "RedisGatewayChannel"]

GATEWAY_JOB_OPTS: Mapping[str, Any] = {"removeOnComplete": True, "removeOnFail": True}
"""The options of a `startRun` and a `runRequest` job (durable-worker's own)."""

START_RUN_JOB = "startRun"
RUN_REQUEST_JOB = "runRequest"

_HANDLER_ATTEMPTS = 5
_REQUEUE_DELAY_MS = 2_000
# A start-run job must never be failed for stalling (that would lose it): a worker that died
# holding one lets it stall, and the next stall check hands it to another worker.
_UNLIMITED_STALLS = 1_000_000_000

StartRunHandler = Callable[[dict[str, Any], str], Awaitable[None]]
"""Applies one start-run message (its job id for logs); returns once the run exists or the
message was judged unusable (logged and dropped); raises when it could not (retried)."""
RunRequestHandler = Callable[[dict[str, Any], str], Awaitable[dict[str, Any] | None]]
"""Answers one run request (its job id for logs): the reply to publish, or None to drop it."""
MessageListener = Callable[[dict[str, Any]], Awaitable[None] | None]


class RedisGatewayChannel:
    """The gateway's names on one Redis under one effective prefix (`P`).

    Build it with the same `url`, `prefix` and `namespace` as the control plane's
    `RedisTransport` (or from that transport with `of`). `timing` tunes the BullMQ workers the
    control-plane side starts; `ping_interval_s` how often subscriptions check their
    connection; `concurrency` how many requests the control plane answers at once."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379",
        *,
        prefix: str = "durable",
        namespace: str | None = None,
        timing: WorkerTiming | None = None,
        ping_interval_s: float = 30.0,
        concurrency: int = 16,
    ):
        self.url = url
        self.prefix = effective_prefix(prefix, namespace)
        self._timing = dataclasses.replace(
            timing or WorkerTiming(), max_stalled_count=_UNLIMITED_STALLS
        )
        self._ping_interval = ping_interval_s
        self._concurrency = max(1, concurrency)
        self._producer = Producer(url)
        self._workers: list[BullWorker] = []
        self._subscriptions: list[ChannelSubscription] = []

    @classmethod
    def of(cls, transport: RedisTransport, **options: Any) -> RedisGatewayChannel:
        """The channel on the same server and prefix as `transport` (its own connections)."""
        channel = cls(transport.url, **options)
        channel.prefix = transport.names.prefix
        return channel

    # -------------------------------------------------------------- names

    @property
    def start_run_queue(self) -> str:
        return f"{self.prefix}-start-run"

    @property
    def run_request_queue(self) -> str:
        return f"{self.prefix}-run-request"

    @property
    def run_reply_channel(self) -> str:
        return f"{self.prefix}-run-reply"

    def tenant_events_channel(self, tenant: str) -> str:
        return f"{self.prefix}-tenant-events-{tenant}"

    # -------------------------------------------------------------- connections

    def _redis(self) -> Redis:
        return self._producer.redis()

    def _queue(self, name: str) -> BullQueue:
        return self._producer.queue(name)

    def _unavailable(self, doing: str, exc: BaseException) -> TransportUnavailableError:
        return TransportUnavailableError(f"redis gateway could not {doing}: {exc}")

    async def _add(self, queue: str, job_name: str, data: Mapping[str, Any], opts: Any) -> None:
        try:
            await self._queue(queue).add(job_name, dict(data), opts)
        except (RedisError, OSError) as exc:
            raise self._unavailable(f"queue a {job_name} job on {queue}", exc) from exc

    async def _publish(self, channel: str, payload: Mapping[str, Any]) -> None:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
        try:
            await self._redis().publish(channel, text)
        except (RedisError, OSError) as exc:
            raise self._unavailable(f"publish on {channel}", exc) from exc

    async def _subscribe(self, channel: str, listener: MessageListener) -> ChannelSubscription:
        def on_message(raw: str) -> Awaitable[None] | None:
            try:
                data = json.loads(raw)
            except ValueError:
                data = None
            if not isinstance(data, dict):
                log.warning(
                    "dropped a message on %s that is not a JSON object: %.200s", channel, raw
                )
                return None
            return listener(data)

        try:
            subscription = await open_subscription(
                self.url, channel, on_message, ping_interval=self._ping_interval
            )
        except (RedisError, OSError) as exc:
            raise self._unavailable(f"subscribe to {channel}", exc) from exc
        self._subscriptions.append(subscription)
        return subscription

    # -------------------------------------------------------------- control-plane side

    async def serve(self, start_runs: StartRunHandler, run_requests: RunRequestHandler) -> None:
        """Consume `P-start-run` into `start_runs` and `P-run-request` into `run_requests`,
        publishing each reply on `P-run-reply` (idempotent: a second call does nothing)."""
        if self._workers:
            return
        try:
            await self._redis().ping()
        except (RedisError, OSError) as exc:
            raise self._unavailable("be reached", exc) from exc
        self._workers = [
            BullWorker(
                self.start_run_queue,
                self._start_run_processor(start_runs),
                url=self.url,
                concurrency=self._concurrency,
                timing=self._timing,
            ),
            BullWorker(
                self.run_request_queue,
                self._run_request_processor(run_requests),
                url=self.url,
                concurrency=self._concurrency,
                timing=self._timing,
            ),
        ]

    def _start_run_processor(
        self, handler: StartRunHandler
    ) -> Callable[[BullJob], Awaitable[None]]:
        queue = self.start_run_queue

        async def process(job: BullJob) -> None:
            if job.name != START_RUN_JOB or not isinstance(job.data, dict):
                log.warning("dropped job %s on %s: not a %s message", job.id, queue, START_RUN_JOB)
                return
            pause = 0.05
            for attempt in range(1, _HANDLER_ATTEMPTS + 1):
                try:
                    await handler(job.data, job.id)
                    return
                except Exception as exc:
                    log.warning(
                        "start-run job %s on %s failed (attempt %d): %s",
                        job.id,
                        queue,
                        attempt,
                        exc,
                    )
                    await asyncio.sleep(pause)
                    pause = min(2.0, pause * 2)
            # Still failing (the store is down): put it back, delayed, before acknowledging
            # this delivery. If Redis refuses that too, raising leaves the job to BullMQ.
            await self._queue(queue).add(
                START_RUN_JOB, job.data, {**GATEWAY_JOB_OPTS, "delay": _REQUEUE_DELAY_MS}
            )

        return process

    def _run_request_processor(
        self, handler: RunRequestHandler
    ) -> Callable[[BullJob], Awaitable[None]]:
        queue = self.run_request_queue

        async def process(job: BullJob) -> None:
            if job.name != RUN_REQUEST_JOB or not isinstance(job.data, dict):
                log.warning(
                    "dropped job %s on %s: not a %s message", job.id, queue, RUN_REQUEST_JOB
                )
                return
            try:
                reply = await handler(job.data, job.id)
            except Exception:
                # The handler answers every failure itself; one that escapes is a bug, and
                # must not stop the consumer. The tenant's wait times out.
                log.exception("run request job %s on %s raised", job.id, queue)
                return
            if reply is None:
                return
            try:
                await self.publish_reply(reply)
            except TransportUnavailableError as exc:
                # A reply is not worth redelivering the request for (a verb may not be
                # idempotent); the tenant's wait times out.
                log.warning("lost the reply to run request job %s: %s", job.id, exc)

        return process

    async def publish_reply(self, reply: Mapping[str, Any]) -> None:
        await self._publish(self.run_reply_channel, reply)

    async def publish_tenant_event(self, tenant: str, message: Mapping[str, Any]) -> None:
        await self._publish(self.tenant_events_channel(tenant), message)

    # -------------------------------------------------------------- tenant side

    async def start_run(self, message: Mapping[str, Any]) -> None:
        """Queue a start-run message; returns once Redis holds it."""
        await self._add(self.start_run_queue, START_RUN_JOB, message, GATEWAY_JOB_OPTS)

    async def send_request(self, request: Mapping[str, Any]) -> None:
        """Queue a run request; returns once Redis holds it."""
        await self._add(self.run_request_queue, RUN_REQUEST_JOB, request, GATEWAY_JOB_OPTS)

    async def subscribe_replies(self, listener: MessageListener) -> Callable[[], Awaitable[None]]:
        """Call `listener` with every reply on `P-run-reply`; the returned function stops."""
        return self._closer(await self._subscribe(self.run_reply_channel, listener))

    async def subscribe_tenant_events(
        self, tenant: str, listener: MessageListener
    ) -> Callable[[], Awaitable[None]]:
        """Call `listener` with every message on `P-tenant-events-<tenant>`; the returned
        function stops."""
        return self._closer(await self._subscribe(self.tenant_events_channel(tenant), listener))

    def _closer(self, subscription: ChannelSubscription) -> Callable[[], Awaitable[None]]:
        async def close() -> None:
            with contextlib.suppress(ValueError):
                self._subscriptions.remove(subscription)
            await subscription.close()

        return close

    # -------------------------------------------------------------- lifecycle

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop consuming (requests in hand get `grace_s` seconds; the rest stay queued),
        close the subscriptions and the connection."""
        workers, self._workers = self._workers, []
        for worker in workers:
            with contextlib.suppress(Exception):
                await worker.close(grace_s)
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            await subscription.close()
        await self._producer.close()
