"""The Redis transport's names and its plain keys and channels (everything that is not a queue).

Queue names and plain names share one prefix `P` (the transport's key prefix with its namespace
folded in) and carry no `bull:` prefix of their own, exactly as `durable-worker` writes them:

- `P-tasks-<token>`, `P-results`: BullMQ queues (see `redis_bullmq`);
- `P-control`: broadcast control messages (cancel a run, engine events, a run just enqueued);
- `P-heartbeat`: run-scoped liveness beats a worker publishes while it replays a workflow turn;
- `P-worker-heartbeat:<token>:<instance>`: a worker's liveness key, `EX 35`, refreshed every 10 s;
- `P-worker-descriptor:<token>:<instance>`: the same worker's descriptor, same lifetime.

Everything read here is untrusted (other SDKs, older versions, a person with `redis-cli`): the
parsers return None for what they cannot read and never raise. Liveness values are read by the
handshake's `parse_heartbeat_value`, which also knows the older forms (bare numbers, seconds).

The liveness and descriptor keys are read as bytes (`WorkerKeyReader`), on a client of their
own: one value that is not UTF-8 would otherwise make the decoding client fail the whole read.
A value's length is asked first and a value over its bound (`MAX_DESCRIPTOR_BYTES`,
`MAX_HEARTBEAT_BYTES`) is never fetched; a key of another type, a name that is not UTF-8 or
longer than `MAX_WORKER_KEY_CHARS`, is skipped. Each such key is logged once, not per read.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import ResponseError

from durably._core.log_context import durably_logger
from durably._transport.redis_bullmq import redis_client

log = durably_logger("durably.redis")

__all__ = [
    "ChannelSubscription",
    "ControlMessage",
    "RedisNames",
    "RunBeat",
    "WorkerBeat",
    "WorkerKeyReader",
    "liveness_value",
    "parse_control_message",
    "parse_run_beat",
    "scan_keys",
]

LIVENESS_TTL_S = 35
"""Liveness and descriptor keys expire this long after their last refresh (a dead worker's
keys vanish on their own)."""
LIVENESS_REFRESH_S = 10.0
"""How often a serving process refreshes its keys; well under the TTL so one slow refresh does
not make a live worker look dead."""


def _glob_escape(text: str) -> str:
    """`text` matched literally in a SCAN pattern."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


@dataclass(frozen=True, slots=True)
class RedisNames:
    """The names under one effective prefix."""

    prefix: str

    def tasks(self, token: str) -> str:
        return f"{self.prefix}-tasks-{token}"

    @property
    def results(self) -> str:
        return f"{self.prefix}-results"

    @property
    def control(self) -> str:
        return f"{self.prefix}-control"

    @property
    def heartbeat(self) -> str:
        return f"{self.prefix}-heartbeat"

    def worker_heartbeat(self, token: str, instance_id: str) -> str:
        return f"{self.prefix}-worker-heartbeat:{token}:{instance_id}"

    def worker_descriptor(self, token: str, instance_id: str) -> str:
        return f"{self.prefix}-worker-descriptor:{token}:{instance_id}"

    def worker_heartbeat_pattern(self, token: str | None = None) -> str:
        base = _glob_escape(f"{self.prefix}-worker-heartbeat:")
        return f"{base}{_glob_escape(token)}:*" if token is not None else f"{base}*"

    def worker_descriptor_pattern(self, token: str | None = None) -> str:
        base = _glob_escape(f"{self.prefix}-worker-descriptor:")
        return f"{base}{_glob_escape(token)}:*" if token is not None else f"{base}*"

    def split_worker_key(self, key: str, kind: str) -> tuple[str, str] | None:
        """(token, instance id) of a `P-worker-<kind>:<token>:<instance>` key, else None.
        Tokens never hold `:` (queue names cannot), so the token ends at the first one."""
        head = f"{self.prefix}-worker-{kind}:"
        if not key.startswith(head):
            return None
        token, sep, instance_id = key[len(head) :].partition(":")
        if not sep or not token or not instance_id:
            return None
        return token, instance_id


MAX_WORKER_KEY_CHARS = 1024
"""The longest liveness or descriptor key name read: a token and an instance id are short; a
longer name is skipped (it would be carried into every answer that lists workers)."""

# Keys remembered as already reported: bounded, as the keys are anyone's to create.
_REPORTED_MAX = 10_000


class WorkerKeyReader:
    """Reads liveness and descriptor keys as bytes, bounded (see the module docstring). The
    client is made on first use and closed by `close`."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._client: Redis | None = None
        self._reported: dict[str, None] = {}

    def _redis(self) -> Redis:
        if self._client is None:
            self._client = Redis.from_url(
                self._url, decode_responses=False, socket_connect_timeout=2.0, socket_timeout=10.0
            )
        return self._client

    def report(self, key: str, problem: str) -> None:
        """Log an unreadable key once (again only after it was read fine in between)."""
        if key in self._reported:
            return
        if len(self._reported) >= _REPORTED_MAX:
            self._reported.pop(next(iter(self._reported)))
        self._reported[key] = None
        log.warning("skipped the unreadable worker key %.300s: %s", key, problem)

    def readable(self, key: str) -> None:
        self._reported.pop(key, None)

    async def read(self, pattern: str, limit: int) -> list[tuple[str, bytes | None]]:
        """(key, value) of every key matching `pattern` whose name can be read. The value is
        None for a key gone meanwhile, of another type, or over `limit` bytes (then also
        reported). Redis errors propagate (the caller names the outage)."""
        client = self._redis()
        keys: list[str] = []
        async for raw_key in client.scan_iter(match=pattern, count=100):
            key = _key_text(raw_key)
            if key is None:
                self.report(repr(raw_key[:200]), "its name is not UTF-8")
            elif len(key) > MAX_WORKER_KEY_CHARS:
                self.report(key, f"its name is over {MAX_WORKER_KEY_CHARS} characters")
            else:
                keys.append(key)
        if not keys:
            return []
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.strlen(key)
        lengths = await pipe.execute(raise_on_error=False)
        wanted: list[str] = []
        for key, length in zip(keys, lengths, strict=True):
            if isinstance(length, ResponseError):
                self.report(key, "not a string value")
            elif isinstance(length, int) and length > limit:
                self.report(key, f"its value is {length} bytes, over {limit}")
            elif isinstance(length, int) and length > 0:
                wanted.append(key)
        values = await client.mget(wanted) if wanted else []
        got = dict(zip(wanted, values, strict=True))
        return [(key, got.get(key)) for key in keys]

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()


def _key_text(raw: object) -> str | None:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


async def scan_keys(client: Redis, pattern: str) -> list[str]:
    """Every key matching `pattern`, by SCAN (KEYS would block a shared server)."""
    found: list[str] = []
    async for key in client.scan_iter(match=pattern, count=100):
        found.append(str(key))
    return found


# ------------------------------------------------------------------ liveness keys


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """One worker's liveness key on a token."""

    token: str
    instance_id: str
    last_beat_at: int
    """Epoch ms of its last refresh; 0 when the value could not be read (the key's presence
    alone still means the worker is alive)."""
    status: dict[str, Any] | None = None
    """The worker's self-reported status (concurrency, in-flight, memory…) when it sends one."""
    descriptor_hash: str | None = None
    """The hash of its current descriptor: re-read the descriptor key when it changes."""


def liveness_value(
    status: Mapping[str, Any] | None, descriptor_hash: str | None, now_ms: int | None = None
) -> str:
    """A liveness key's value as durable-worker writes it: `ts` always in epoch ms."""
    payload: dict[str, Any] = {"ts": int(time.time() * 1000) if now_ms is None else now_ms}
    if status is not None:
        payload["status"] = dict(status)
    if descriptor_hash is not None:
        payload["descriptorHash"] = descriptor_hash
    return json.dumps(payload, separators=(",", ":"))


# ------------------------------------------------------------------ control and beat channels


@dataclass(frozen=True, slots=True)
class ControlMessage:
    """A broadcast control message: `cancel` (mark a run cancelled wherever it runs),
    `enqueued` (a run was just created elsewhere: try to drive it now) or `event` (an engine
    event for live listeners, never persisted). Other kinds from newer peers are passed on."""

    kind: str
    sender: str | None = None
    """The publisher's instance id (`from` on the wire)."""
    run_id: str | None = None
    event: Mapping[str, Any] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.raw)
        out["kind"] = self.kind
        if self.sender is not None:
            out["from"] = self.sender
        if self.run_id is not None:
            out["runId"] = self.run_id
        if self.event is not None:
            out["event"] = dict(self.event)
        return out


def parse_control_message(raw: str | bytes) -> ControlMessage | None:
    """A ControlMessage from the channel, or None when it is not one (logged by the caller)."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return None
    kind: str = data["kind"]
    sender = data.get("from")
    run_id = data.get("runId")
    event = data.get("event")
    if kind in ("cancel", "enqueued") and (not isinstance(run_id, str) or not run_id):
        return None
    if kind == "event" and not isinstance(event, dict):
        return None
    return ControlMessage(
        kind=kind,
        sender=sender if isinstance(sender, str) else None,
        run_id=run_id if isinstance(run_id, str) else None,
        event=event if isinstance(event, dict) else None,
        raw=data,
    )


@dataclass(frozen=True, slots=True)
class RunBeat:
    """A liveness beat on the heartbeat channel. Without `step_id` it keeps a workflow turn's
    silence window open (durable-worker sends `seq` 0 and the turn's token every 5 s); with it,
    a step's."""

    run_id: str
    seq: int
    group: str
    step_id: str | None = None


def parse_run_beat(raw: str | bytes) -> RunBeat | None:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    run_id, seq, group, step_id = (
        data.get("runId"),
        data.get("seq"),
        data.get("group"),
        data.get("stepId"),
    )
    if isinstance(seq, float) and seq.is_integer():
        seq = int(seq)
    if not isinstance(run_id, str) or not run_id or not isinstance(group, str):
        return None
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        return None
    return RunBeat(
        run_id=run_id,
        seq=seq,
        group=group,
        step_id=step_id if isinstance(step_id, str) and step_id else None,
    )


MessageHandler = Callable[[str], Awaitable[None] | None]


class ChannelSubscription:
    """One pub/sub channel on a connection of its own, kept alive across Redis restarts.

    The connection is PINGed every `ping_interval` seconds; a PONG that does not come back within
    `min(5 s, interval)` (or any read error) drops the connection, which is rebuilt and
    resubscribed with a growing pause. Messages published while it was down are lost, as with any
    pub/sub: every use of these channels tolerates that (a cancel is also in the store, a beat
    repeats). Handlers run one at a time in arrival order; one that raises is logged."""

    def __init__(
        self,
        client: Redis,
        channel: str,
        handler: MessageHandler,
        *,
        ping_interval: float = 30.0,
        owns_client: bool = False,
    ):
        self.channel = channel
        self._owns_client = owns_client
        self._client = client
        self._handler = handler
        self._ping_interval = ping_interval
        self._pubsub: PubSub | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        """Subscribe (raises when Redis is unreachable), then listen in the background."""
        self._pubsub = await self._subscribe()
        self._task = asyncio.create_task(self._listen(), name=f"redis-sub:{self.channel}")

    async def _subscribe(self) -> PubSub:
        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.channel)
        except BaseException:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            raise
        return pubsub

    async def _listen(self) -> None:
        pause = 0.2
        next_ping = time.monotonic() + self._ping_interval
        pong_due: float | None = None
        while not self._closed:
            try:
                if self._pubsub is None:
                    self._pubsub = await self._subscribe()
                    next_ping = time.monotonic() + self._ping_interval
                    pong_due = None
                    log.info("resubscribed to %s", self.channel)
                message = await self._pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=0.5
                )
                pause = 0.2
                now = time.monotonic()
                if message is not None:
                    if message.get("type") == "pong":
                        pong_due = None
                    elif message.get("type") == "message":
                        await self._deliver(message.get("data"))
                if pong_due is not None and now > pong_due:
                    raise ConnectionError(f"no PONG on {self.channel}")
                if now >= next_ping:
                    await self._pubsub.ping()
                    pong_due = now + min(5.0, self._ping_interval)
                    next_ping = now + self._ping_interval
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._closed:
                    return
                log.warning("subscription to %s lost (%s); reconnecting", self.channel, exc)
                await self._drop()
                await asyncio.sleep(pause)
                pause = min(5.0, pause * 2)

    async def _deliver(self, data: object) -> None:
        if not isinstance(data, (str, bytes)):
            return
        try:
            outcome = self._handler(data if isinstance(data, str) else data.decode())
            if inspect.isawaitable(outcome):
                await outcome
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("handler of %s raised", self.channel, exc_info=True)

    async def _drop(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._drop()
        if self._owns_client:
            with contextlib.suppress(Exception):
                await self._client.aclose()


async def open_subscription(
    url: str,
    channel: str,
    on_message: MessageHandler,
    *,
    ping_interval: float,
) -> ChannelSubscription:
    """A started subscription to `channel` on a client of its own with patient retries, so it
    rides out a Redis restart; closed again when it cannot start (the error propagates)."""
    subscription = ChannelSubscription(
        redis_client(url, patient=True),
        channel,
        on_message,
        ping_interval=ping_interval,
        owns_client=True,
    )
    try:
        await subscription.start()
    except BaseException:
        await subscription.close()
        raise
    return subscription
