"""`InMemoryTransport`: the reference transport, with its broker in this process.

It implements the whole `Transport` contract with asyncio queues: tasks queued per routing
token, results on one queue every engine sharing the broker consumes, at-least-once delivery
(a result the sink refused is put back and offered again; a result the store could never hold —
`NaN`, over the sink's `max_payload_bytes` — is replaced first by the failed stand-in that
`vet_step_result` gives, as the wire transports do). It is what the engine's remote-step
rules are tested against before the real brokers (PostgreSQL tables, Redis), and it serves an
embedded setup that wants the remote semantics — `pending` rows, retries by result, a separate
serving pool — inside one process.

It carries worker descriptors too (`features.worker_descriptors`): every step server started on
the broker is listed, with the descriptor its engine announces (its `capabilities`), until it
drains. That is what capability routing reads, so a step declared `requires=["gpu"]` is
dispatched while some engine serving it on the broker declares `gpu` — and otherwise parked
`blocked` with the reason, exactly as over Redis. A server is live for as long as it serves:
in one process there is no heartbeat to miss, so each read stamps the entries with the time of
the read.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from durably._core.handshake import WorkerDescriptor, descriptor_hash, descriptor_to_wire
from durably._core.log_context import durably_logger
from durably._core.wire import RemoteTask, StepResult, vet_step_result
from durably._transport.protocol import (
    ControlChannel,
    GatewayChannel,
    ResultSink,
    StepHandler,
    StepServer,
    TransportFeatures,
    TurnChannel,
    WorkerDirectory,
    result_size_limit,
)

log = durably_logger("durably.transport")

__all__ = ["InMemoryBroker", "InMemoryTransport"]

# Results handed to the sink at once, at most: a wide fan settles in batches of this size.
_BATCH = 500

# Names for servers started without a descriptor (they are listed, but offer nothing).
_anonymous = itertools.count(1)


@dataclass(frozen=True, slots=True)
class _Beat:
    """One live server's entry on one token (a `WorkerBeatView`)."""

    token: str
    instance_id: str
    last_beat_at: int
    status: Mapping[str, Any] | None
    descriptor_hash: str | None


class InMemoryBroker:
    """The queues several in-process transports share (one broker, many engines), and the
    step servers live on them with what they announce."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Queue[RemoteTask]] = {}
        self.results: asyncio.Queue[StepResult] = asyncio.Queue()
        self.dispatched: list[RemoteTask] = []  # every task ever queued, for inspection
        self._servers: list[_Server] = []  # the live ones, in the order they started

    def serve(
        self,
        tokens: Sequence[str],
        handler: StepHandler,
        *,
        concurrency: int,
        descriptor: WorkerDescriptor | None = None,
    ) -> StepServer:
        """Start serving the tasks queued on `tokens`, listed with `descriptor` until drained
        (what `InMemoryTransport.step_server` does)."""
        server = _Server(self, tokens, handler, concurrency, descriptor, leave=self._leave)
        self._servers.append(server)
        return server

    def _leave(self, server: _Server) -> None:
        if server in self._servers:
            self._servers.remove(server)

    # The broker's worker directory (`WorkerDirectory`): what the live servers announce.

    async def list_worker_groups(self) -> set[str]:
        return {token for server in self._servers for token in server.tokens}

    async def read_worker_descriptors(self, token: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        seen: set[str] = set()
        for server in self._servers:
            descriptor = server.descriptor
            if descriptor is None or (token is not None and token not in server.tokens):
                continue
            if descriptor.instance_id in seen:  # one per instance id, as over Redis
                continue
            seen.add(descriptor.instance_id)
            found.append(descriptor_to_wire(descriptor))
        return found

    async def read_worker_heartbeats(self, token: str | None = None) -> list[_Beat]:
        now = int(time.time() * 1000)
        beats = [
            _Beat(t, server.instance_id, now, server.status(), server.descriptor_hash)
            for server in self._servers
            for t in server.tokens
            if token is None or t == token
        ]
        return sorted(beats, key=lambda b: (b.token, b.instance_id))

    async def queue_depth(self, token: str) -> int:
        queue = self._tasks.get(token)
        waiting = queue.qsize() if queue is not None else 0
        return waiting + sum(server.running(token) for server in self._servers)

    def queue(self, token: str) -> asyncio.Queue[RemoteTask]:
        queue = self._tasks.get(token)
        if queue is None:
            queue = self._tasks[token] = asyncio.Queue()
        return queue

    def publish_result(self, result: StepResult) -> None:
        self.results.put_nowait(result)


class _Server:
    def __init__(
        self,
        broker: InMemoryBroker,
        tokens: Sequence[str],
        handler: StepHandler,
        n: int,
        descriptor: WorkerDescriptor | None,
        *,
        leave: Callable[[_Server], None],
    ):
        self._broker = broker
        self._leave = leave
        self._handler = handler
        self._draining = False
        self.tokens = tuple(dict.fromkeys(tokens))
        self.descriptor = descriptor
        # Computed once: a descriptor changes only with a new process (its `startedAt`).
        self.descriptor_hash = descriptor_hash(descriptor) if descriptor is not None else None
        self.instance_id = (
            descriptor.instance_id if descriptor is not None else f"memory-{next(_anonymous)}"
        )
        self._limit = max(1, n)
        self._running: dict[str, int] = {}
        self._workers = [
            asyncio.create_task(self._serve(token), name=f"durably-serve-{token}")
            for token in self.tokens
            for _ in range(self._limit)
        ]
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def status(self) -> dict[str, Any]:
        """What this server reports about itself (a `WorkerStatus`, as over Redis)."""
        return {
            "runtime": "python",
            "concurrency": {"mode": "fixed", "limit": self._limit},
            "inFlight": self._busy,
        }

    def running(self, token: str) -> int:
        """Tasks of `token` this server is running now."""
        return self._running.get(token, 0)

    async def _serve(self, token: str) -> None:
        queue = self._broker.queue(token)
        while not self._draining:
            task = await queue.get()
            if self._draining:
                queue.put_nowait(task)  # not taken: the next server gets it
                return
            self._busy += 1
            self._running[token] = self._running.get(token, 0) + 1
            self._idle.clear()
            try:
                result = await self._handler(task)
            except Exception as exc:  # a handler never should; keep the task
                log.exception("serving %s failed: %s", task.step_id, exc)
                queue.put_nowait(task)
                continue
            finally:
                self._busy -= 1
                self._running[token] -= 1
                if not self._busy:
                    self._idle.set()
            self._broker.publish_result(result)

    async def drain(self, timeout: float) -> None:
        self._draining = True
        # Off the directory first: a server that takes no more tasks offers nothing, so no
        # step is dispatched on the strength of its capabilities from now on.
        self._leave(self)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            pass
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)


class InMemoryTransport:
    """A transport whose broker is an `InMemoryBroker` in this process."""

    def __init__(self, broker: InMemoryBroker | None = None):
        self.broker = broker or InMemoryBroker()
        self._consumer: asyncio.Task[None] | None = None

    @property
    def kind(self) -> str:
        return "memory"

    @property
    def features(self) -> TransportFeatures:
        return TransportFeatures(worker_descriptors=True)

    async def start(self, sink: ResultSink) -> None:
        if self._consumer is None:
            self._consumer = asyncio.create_task(self._consume(sink), name="durably-results")

    async def _consume(self, sink: ResultSink) -> None:
        results = self.broker.results
        limit = result_size_limit(sink)
        while True:
            taken = [await results.get()]
            while len(taken) < _BATCH and not results.empty():
                taken.append(results.get_nowait())
            batch = []
            for result in taken:
                vetted = vet_step_result(result, max_bytes=limit)
                if vetted is not result:
                    log.warning(
                        "refused step result %s: %s",
                        result.step_id,
                        vetted.error.message if vetted is not None and vetted.error else "dropped",
                    )
                if vetted is not None:
                    batch.append(vetted)
            if not batch:
                continue
            try:
                await sink.step_results(batch)
            except asyncio.CancelledError:
                for result in batch:
                    results.put_nowait(result)
                raise
            except Exception:
                log.warning("settling %d step result(s) failed; offering them again", len(batch))
                for result in batch:
                    results.put_nowait(result)
                await asyncio.sleep(0.05)

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)

    @property
    def gateway(self) -> GatewayChannel | None:
        return None  # tenants reach a control plane over Redis

    @property
    def control(self) -> ControlChannel | None:
        return None  # no broadcast channel on this transport

    @property
    def directory(self) -> WorkerDirectory:
        """The step servers live on the broker and their descriptors (capability routing
        and worker health read them)."""
        return self.broker

    @property
    def redis_server(self) -> tuple[str, str] | None:
        return None  # not on Redis

    @property
    def turns(self) -> TurnChannel | None:
        return None  # remote workflow turns need a broker workflow workers consume

    async def dispatch(self, task: RemoteTask) -> None:
        self.broker.dispatched.append(task)
        self.broker.queue(task.group).put_nowait(task)

    async def step_server(
        self,
        tokens: Sequence[str],
        handler: StepHandler,
        *,
        concurrency: int,
        descriptor: WorkerDescriptor | None = None,
    ) -> StepServer:
        return self.broker.serve(tokens, handler, concurrency=concurrency, descriptor=descriptor)
