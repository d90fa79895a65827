"""`RedisTransport`: steps to and from workers over Redis, with the BullMQ job protocol that the
published `durable-worker` SDK (and TypeScript workers of the same protocol) speak.

- `dispatch(task)` adds a `task` job to `P-tasks-<task.group>`; it returns once Redis holds it.
- `start(sink)` consumes `P-results` into the engine's sink in batches, acknowledging a result
  only after the sink applied it (`redis_results` describes batching and retries).
- `step_server(tokens, handler, concurrency=…)` is durably's own serving side
  (`redis_server`).
- The control channel (`publish_control`, `cancel_run`, `subscribe_control`), the run-beat
  channel (`subscribe_run_beats`) and the liveness reads (`read_worker_heartbeats`,
  `read_worker_descriptors`, `list_worker_groups`, `queue_depth`) are for the engine to call
  when it uses those features; nothing here calls them on its own.

`P` is the key prefix (default `durable`) with the transport's namespace folded in
(`durable-dev`); a namespace isolates deployments sharing one Redis and must match the workers'.
Tenant tokens (`name@tenant`) live on the bare prefix, so a namespaced transport refuses them and
the transport pool can try another member.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.exceptions import RedisError

from durably._core.bounds import PayloadRejectedError, loads_untrusted
from durably._core.handshake import (
    MAX_DESCRIPTOR_BYTES,
    MAX_HEARTBEAT_BYTES,
    WorkerDescriptor,
    read_heartbeat_value,
)
from durably._core.log_context import durably_logger
from durably._core.wire import RemoteTask, effective_prefix, to_broker_priority
from durably._transport.protocol import (
    ResultSink,
    StepHandler,
    Transport,
    TransportFeatures,
    TransportUnavailableError,
    result_size_limit,
)
from durably._transport.redis_bullmq import BullQueue, Producer, WorkerTiming
from durably._transport.redis_gateway import RedisGatewayChannel
from durably._transport.redis_plain import (
    LIVENESS_REFRESH_S,
    ChannelSubscription,
    ControlMessage,
    RedisNames,
    RunBeat,
    WorkerBeat,
    WorkerKeyReader,
    open_subscription,
    parse_control_message,
    parse_run_beat,
)
from durably._transport.redis_results import ResultConsumer, ResultIntake
from durably._transport.redis_server import RedisStepServer
from durably._transport.redis_turns import RedisTurns

log = durably_logger("durably.redis")

__all__ = [
    "ControlMessage",
    "RedisTransport",
    "ResultIntake",
    "RunBeat",
    "TenantTokenRefusedError",
    "WorkerBeat",
    "WorkerTiming",
]

STEP_JOB_OPTS: Mapping[str, Any] = {"removeOnComplete": True, "removeOnFail": {"age": 86400}}
"""A step task job's options. Failed step jobs are kept a day so that whichever worker sees
the failure can still read the payload and publish the failed result for it."""

_QUEUE_DEPTH_STATES = ("waiting", "active", "delayed", "prioritized")

ControlHandler = Callable[[ControlMessage], Awaitable[None] | None]
BeatHandler = Callable[[RunBeat], Awaitable[None] | None]


class TenantTokenRefusedError(TransportUnavailableError):
    """A namespaced transport was asked to queue a tenant token (`name@tenant`); tenant tokens
    live on the bare prefix. A `TransportUnavailableError` so the pool tries its next member."""


def _default_instance_id() -> str:
    # The instance id is the last `:` segment of liveness keys, so it must not contain one.
    return f"durably-{socket.gethostname()}-{os.getpid()}".replace(":", "-")


def _where(url: str) -> str:
    """host:port (or the socket path) of a Redis URL, without credentials, for messages."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"


class RedisTransport:
    """A Redis/BullMQ transport of an engine (a member of its transport pool).

    - `url`: the Redis server (`redis://host:port/db`, credentials allowed; messages name only
      host and port).
    - `prefix`, `namespace`: the key prefix `P` (see the module's description); both must match
      the workers'.
    - `instance_id`: this process's id as control messages (`from`) and liveness keys carry it;
      pass the engine's own id so its control subscription skips what it published itself.
    - `intake`: result batching and retries; `timing`: BullMQ lock and stall intervals of every
      worker this transport starts (results consumer and step servers).
    - `liveness_interval_s`, `ping_interval_s`: how often step servers refresh their liveness
      keys and subscriptions check their connection.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379",
        *,
        prefix: str = "durable",
        namespace: str | None = None,
        instance_id: str | None = None,
        intake: ResultIntake | None = None,
        timing: WorkerTiming | None = None,
        liveness_interval_s: float = LIVENESS_REFRESH_S,
        ping_interval_s: float = 30.0,
    ):
        self.url = url
        self.where = _where(url)
        self.namespace = namespace if namespace not in (None, "", "default") else None
        self.names = RedisNames(effective_prefix(prefix, namespace))
        self.instance_id = (instance_id or _default_instance_id()).replace(":", "-")
        self._intake = intake or ResultIntake()
        self._timing = timing or WorkerTiming()
        self._liveness_interval = liveness_interval_s
        self._ping_interval = ping_interval_s
        self._producer = Producer(url)
        self._keys = WorkerKeyReader(url)
        self._consumer: ResultConsumer | None = None
        self._servers: list[RedisStepServer] = []
        self._subscriptions: list[ChannelSubscription] = []
        self._turns = RedisTurns(
            url=url,
            names=self.names,
            timing=self._timing,
            queue=self._queue,
            check_token=self._check_token,
            subscribe_beats=self.subscribe_run_beats,
        )
        self._gateway = RedisGatewayChannel.of(
            self, timing=self._timing, ping_interval_s=self._ping_interval
        )
        self._features = TransportFeatures(
            workflow_turns=True, worker_descriptors=True, control_messages=True
        )

    @property
    def kind(self) -> str:
        return "redis"

    @property
    def features(self) -> TransportFeatures:
        return self._features

    @property
    def turns(self) -> RedisTurns:
        """Remote workflow turns (`redis_turns`)."""
        return self._turns

    @property
    def gateway(self) -> RedisGatewayChannel:
        """The tenant gateway's queues and channels on this server and prefix."""
        return self._gateway

    @property
    def redis_server(self) -> tuple[str, str]:
        """This transport's server and key prefix (its namespace folded in)."""
        return self.url, str(self.names.prefix)

    @property
    def control(self) -> RedisTransport:
        """Control messages on `P-control` (`cancel_run`, `publish_control`)."""
        return self

    @property
    def directory(self) -> RedisTransport:
        """Live workers' liveness and descriptor keys (`list_worker_groups`,
        `read_worker_descriptors`, `read_worker_heartbeats`) and the task queues' depths
        (`queue_depth`): what worker health and the workflow directory read."""
        return self

    def _unavailable(self, doing: str, exc: BaseException) -> TransportUnavailableError:
        return TransportUnavailableError(f"redis at {self.where} could not {doing}: {exc}")

    def _redis(self) -> Redis:
        return self._producer.redis()

    def _queue(self, name: str) -> BullQueue:
        return self._producer.queue(name)

    # -------------------------------------------------------------- lifecycle

    async def ping(self) -> None:
        """Raise `TransportUnavailableError` unless Redis answers."""
        try:
            await self._redis().ping()
        except (RedisError, OSError) as exc:
            raise self._unavailable("be reached", exc) from exc

    async def start(self, sink: ResultSink) -> None:
        if self._consumer is not None:
            return
        await self.ping()
        self._consumer = ResultConsumer(
            url=self.url,
            queue=self.names.results,
            sink=sink,
            requeue=self._queue(self.names.results),
            intake=self._intake,
            timing=self._timing,
            max_bytes=result_size_limit(sink),
        )
        self._consumer.start()

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.close()
        await self._turns.close(self._intake.close_grace_s)
        await self._gateway.close(self._intake.close_grace_s)
        servers, self._servers = self._servers, []
        for server in servers:
            await server.drain(self._intake.close_grace_s)
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            await subscription.close()
        await self._producer.close()
        await self._keys.close()

    # -------------------------------------------------------------- steps

    def _check_token(self, token: str) -> None:
        if not token or ":" in token:
            raise ValueError(f"{token!r} is not a queue token (non-empty, no ':')")
        if self.namespace is not None and "@" in token:
            raise TenantTokenRefusedError(
                f"the redis transport with namespace {self.namespace!r} does not carry tenant "
                f"token {token!r} (tenant tokens live on the bare prefix)"
            )

    async def dispatch(self, task: RemoteTask) -> None:
        self._check_token(task.group)
        opts = dict(STEP_JOB_OPTS)
        priority = to_broker_priority(task.priority)
        if priority is not None:
            opts["priority"] = priority
        try:
            await self._queue(self.names.tasks(task.group)).add("task", task.to_json(), opts)
        except (RedisError, OSError) as exc:
            raise self._unavailable(f"queue step {task.step_id}", exc) from exc

    async def step_server(
        self,
        tokens: Sequence[str],
        handler: StepHandler,
        *,
        concurrency: int,
        descriptor: WorkerDescriptor | None = None,
    ) -> RedisStepServer:
        """Serve step tasks on `tokens`. The liveness keys always go out; with a `descriptor`,
        the descriptor key too, and the liveness value carries its hash."""
        if not tokens:
            raise ValueError("a step server needs at least one token")
        for token in tokens:
            self._check_token(token)
        await self.ping()
        server = RedisStepServer(
            url=self.url,
            names=self.names,
            tokens=tokens,
            handler=handler,
            concurrency=concurrency,
            timing=self._timing,
            instance_id=self.instance_id,
            descriptor=descriptor,
            liveness_interval_s=self._liveness_interval,
        )
        await server.start()
        self._servers = [s for s in self._servers if not s.drained]  # forget drained ones
        self._servers.append(server)
        return server

    async def queue_depth(self, token: str) -> int:
        """Jobs waiting, running, delayed or prioritized on `P-tasks-<token>`."""
        try:
            counts = await self._queue(self.names.tasks(token)).counts(*_QUEUE_DEPTH_STATES)
        except (RedisError, OSError) as exc:
            raise self._unavailable(f"count the jobs of {token!r}", exc) from exc
        return sum(counts.values())

    # -------------------------------------------------------------- control channel

    async def publish_control(self, message: ControlMessage | Mapping[str, Any]) -> None:
        """Broadcast on `P-control`, stamped with this instance as `from` (so our own
        subscribers skip it). Raises `TransportUnavailableError` when Redis refuses."""
        payload = message.to_json() if isinstance(message, ControlMessage) else dict(message)
        payload.setdefault("from", self.instance_id)
        try:
            await self._redis().publish(self.names.control, json.dumps(payload))
        except (RedisError, OSError) as exc:
            raise self._unavailable("publish a control message", exc) from exc

    async def cancel_run(self, run_id: str) -> None:
        """Tell every worker and engine that `run_id` is cancelled (a cooperative abort: steps
        see it at their next check; the store's state is what makes it final)."""
        await self.publish_control({"kind": "cancel", "runId": run_id})

    async def subscribe_control(self, handler: ControlHandler) -> ChannelSubscription:
        """Call `handler` with each control message from other instances. Messages sent by this
        instance and malformed ones are dropped (the latter logged). Close the returned
        subscription to stop; `close()` closes any still open."""

        def on_message(raw: str) -> Awaitable[None] | None:
            message = parse_control_message(raw)
            if message is None:
                log.warning("dropped a malformed control message: %.200s", raw)
                return None
            if message.sender == self.instance_id:
                return None
            return handler(message)

        return await self._subscribe(self.names.control, on_message)

    async def subscribe_run_beats(self, handler: BeatHandler) -> ChannelSubscription:
        """Call `handler` with each liveness beat on `P-heartbeat` (malformed ones dropped)."""

        def on_message(raw: str) -> Awaitable[None] | None:
            beat = parse_run_beat(raw)
            if beat is None:
                log.warning("dropped a malformed heartbeat: %.200s", raw)
                return None
            return handler(beat)

        return await self._subscribe(self.names.heartbeat, on_message)

    async def _subscribe(
        self, channel: str, on_message: Callable[[str], Awaitable[None] | None]
    ) -> ChannelSubscription:
        try:
            subscription = await open_subscription(
                self.url, channel, on_message, ping_interval=self._ping_interval
            )
        except (RedisError, OSError) as exc:
            raise self._unavailable(f"subscribe to {channel}", exc) from exc
        self._subscriptions.append(subscription)
        return subscription

    # -------------------------------------------------------------- liveness reads

    async def read_worker_heartbeats(self, token: str | None = None) -> list[WorkerBeat]:
        """The liveness keys of `token`'s workers (every token's when None). A key present is a
        live worker; its value says when it last beat and how it is doing. A value that cannot
        be read (too big, too deep, not JSON, …) is logged once per key and reads as a beat
        without a value: the key's presence alone still says the worker is alive."""
        pattern = self.names.worker_heartbeat_pattern(token)
        try:
            found = await self._keys.read(pattern, MAX_HEARTBEAT_BYTES)
        except (RedisError, OSError) as exc:
            raise self._unavailable("read worker heartbeats", exc) from exc
        beats: list[WorkerBeat] = []
        for key, value in found:
            where = self.names.split_worker_key(key, "heartbeat")
            if where is None:
                continue
            beat, problem = read_heartbeat_value(value)
            if problem is not None:
                self._keys.report(key, problem)
            elif value is not None:
                self._keys.readable(key)
            beats.append(
                WorkerBeat(where[0], where[1], beat.last_beat_ms, beat.status, beat.descriptor_hash)
            )
        return sorted(beats, key=lambda b: (b.token, b.instance_id))

    async def list_worker_groups(self) -> set[str]:
        """Every token some live worker serves."""
        return {beat.token for beat in await self.read_worker_heartbeats()}

    async def read_worker_descriptors(self, token: str | None = None) -> list[dict[str, Any]]:
        """The descriptors workers publish (raw JSON objects), of `token` or of every token
        (then one per instance id). A value that is not a JSON object within the bounds
        (`MAX_DESCRIPTOR_BYTES`, 128 levels, finite numbers, no lone surrogate) is skipped,
        logged once per key: one garbled worker must not hide the others."""
        pattern = self.names.worker_descriptor_pattern(token)
        try:
            found = sorted(await self._keys.read(pattern, MAX_DESCRIPTOR_BYTES))
        except (RedisError, OSError) as exc:
            raise self._unavailable("read worker descriptors", exc) from exc
        descriptors: list[dict[str, Any]] = []
        seen: set[str] = set()
        for key, value in found:
            if value is None:
                continue  # gone meanwhile, or reported by the reader
            try:
                descriptor = loads_untrusted(
                    value, what="worker descriptor", max_bytes=MAX_DESCRIPTOR_BYTES
                )
            except PayloadRejectedError as exc:
                self._keys.report(key, exc.problem)
                continue
            if not isinstance(descriptor, dict):
                self._keys.report(key, "not a JSON object")
                continue
            self._keys.readable(key)
            if token is None:
                instance = descriptor.get("instanceId")
                if isinstance(instance, str):
                    if instance in seen:
                        continue
                    seen.add(instance)
            descriptors.append(descriptor)
        return descriptors


if TYPE_CHECKING:
    # The type checker proves here that the class fulfils the engine's contract.
    def _is_a_transport(transport: RedisTransport) -> Transport:
        return transport
