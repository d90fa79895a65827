"""A third party proves its transport with durably's transport suite.

`DelegatingTransport` is written the way another project would write a transport of its own:
a class of its own implementing the `Transport` contract explicitly — here each member
hands the call to durably's in-process reference transport, so the suite must pass. It
carries steps only (no workflow turns, gateway, control messages or worker directory), the
smallest transport an engine takes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from durably._core.handshake import WorkerDescriptor
from durably._core.wire import RemoteTask
from durably._transport.protocol import (
    ControlChannel,
    GatewayChannel,
    ResultSink,
    StepHandler,
    StepServer,
    TransportFeatures,
    TurnChannel,
    WorkerDirectory,
)
from durably.testing.conformance import TransportSuite
from durably.transports import InMemoryTransport, Transport


class DelegatingTransport:
    """A transport of its own: steps only, every call delegated to the in-process one."""

    def __init__(self) -> None:
        self._inner = InMemoryTransport()
        self.dispatched = 0

    @property
    def kind(self) -> str:
        return "delegating"

    @property
    def features(self) -> TransportFeatures:
        return TransportFeatures()

    async def start(self, sink: ResultSink) -> None:
        await self._inner.start(sink)

    async def close(self) -> None:
        await self._inner.close()

    async def dispatch(self, task: RemoteTask) -> None:
        self.dispatched += 1
        await self._inner.dispatch(task)

    async def step_server(
        self,
        tokens: Sequence[str],
        handler: StepHandler,
        *,
        concurrency: int,
        descriptor: WorkerDescriptor | None = None,
    ) -> StepServer:
        return await self._inner.step_server(
            tokens, handler, concurrency=concurrency, descriptor=descriptor
        )

    @property
    def turns(self) -> TurnChannel | None:
        return None

    @property
    def gateway(self) -> GatewayChannel | None:
        return None

    @property
    def control(self) -> ControlChannel | None:
        return None

    @property
    def directory(self) -> WorkerDirectory | None:
        return None

    @property
    def redis_server(self) -> tuple[str, str] | None:
        return None


class TestDelegatingTransport(TransportSuite):
    @asynccontextmanager
    async def open_transport(self) -> AsyncIterator[Transport]:
        made = DelegatingTransport()
        yield made
        # The cases went through this transport, not around it.
        assert made.dispatched > 0
