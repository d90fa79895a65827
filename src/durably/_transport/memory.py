"""`InMemoryTransport`: the reference transport, with its broker in this process.

It implements the whole `Transport` contract with asyncio queues: tasks queued per routing
token, results on one queue every engine sharing the broker consumes, at-least-once delivery
(a result the sink refused is put back and offered again; a result the store could never hold —
`NaN`, over the sink's `max_payload_bytes` — is replaced first by the failed stand-in that
`vet_step_result` gives, as the wire transports do). It is what the engine's remote-step
rules are tested against before the real brokers (PostgreSQL tables, Redis), and it serves an
embedded setup that wants the remote semantics — `pending` rows, retries by result, a separate
serving pool — inside one process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from durably._core.handshake import WorkerDescriptor
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

log = logging.getLogger("durably")

__all__ = ["InMemoryBroker", "InMemoryTransport"]

# Results handed to the sink at once, at most: a wide fan settles in batches of this size.
_BATCH = 500


class InMemoryBroker:
    """The queues several in-process transports share (one broker, many engines)."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Queue[RemoteTask]] = {}
        self.results: asyncio.Queue[StepResult] = asyncio.Queue()
        self.dispatched: list[RemoteTask] = []  # every task ever queued, for inspection

    def queue(self, token: str) -> asyncio.Queue[RemoteTask]:
        queue = self._tasks.get(token)
        if queue is None:
            queue = self._tasks[token] = asyncio.Queue()
        return queue

    def publish_result(self, result: StepResult) -> None:
        self.results.put_nowait(result)


class _Server:
    def __init__(self, broker: InMemoryBroker, tokens: Sequence[str], handler: StepHandler, n: int):
        self._broker = broker
        self._handler = handler
        self._draining = False
        self._workers = [
            asyncio.create_task(self._serve(token), name=f"durably-serve-{token}")
            for token in tokens
            for _ in range(max(1, n))
        ]
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def _serve(self, token: str) -> None:
        queue = self._broker.queue(token)
        while not self._draining:
            task = await queue.get()
            if self._draining:
                queue.put_nowait(task)  # not taken: the next server gets it
                return
            self._busy += 1
            self._idle.clear()
            try:
                result = await self._handler(task)
            except Exception as exc:  # a handler never should; keep the task
                log.exception("serving %s failed: %s", task.step_id, exc)
                queue.put_nowait(task)
                continue
            finally:
                self._busy -= 1
                if not self._busy:
                    self._idle.set()
            self._broker.publish_result(result)

    async def drain(self, timeout: float) -> None:
        self._draining = True
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
        return TransportFeatures()

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
    def directory(self) -> WorkerDirectory | None:
        return None  # no heartbeats or descriptors on this transport

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
        descriptor: WorkerDescriptor | None = None,  # no descriptors on this transport
    ) -> StepServer:
        return _Server(self.broker, tokens, handler, concurrency)
