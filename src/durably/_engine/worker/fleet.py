"""`FleetLink`: one process's ends of its transport pool — what it dispatches, what it serves,
what it answers and what it tells the other processes of the fleet.

A `Worker` with a transport owns one. The worker decides WHEN each end opens (results and
turn decisions only where workflows run, steps only where runs are driven); this object knows
HOW: the step dispatcher (`RemoteSteps`), the step servers with the descriptor this process
announces, the tenant gateway, the cancel broadcast, and the drain and close of all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from durably._core.bounds import DEFAULT_MAX_PAYLOAD_BYTES
from durably._core.handshake import (
    LEGACY_V1_PROTOCOL,
    SdkInfo,
    WorkerDescriptor,
    control_plane_descriptor,
)
from durably._core.log_context import durably_logger
from durably._engine.defs.intercept import NO_INTERCEPTORS, Interceptors
from durably._engine.defs.registry import Step
from durably._engine.gateway.server import Gateway, Subscribe
from durably._engine.gateway.server import WorkerHealth as WorkerHealthRead
from durably._engine.gateway.wire import GatewaySettings
from durably._engine.remote.steps import RemoteSteps, StepService, step_token

if TYPE_CHECKING:
    from durably._engine.client.handle import RunWatchers
    from durably._engine.control.plane import ControlPlane
    from durably._transport.pool import TransportPool
    from durably._transport.protocol import ResultSink, StepServer, WorkerDirectory

log = durably_logger("durably.worker")

# The version a step worker announces in its descriptor (observability only).
DURABLY_VERSION = "0.1.0"

__all__ = ["DURABLY_VERSION", "FleetLink"]


class FleetLink:
    """The transport pool as this process uses it (module docstring)."""

    def __init__(
        self,
        transports: TransportPool,
        *,
        instance_id: str,
        namespace: str | None,
        capabilities: Sequence[str],
        tenant_token_secret: str | bytes | None,
        step_threads: int,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        interceptors: Interceptors = NO_INTERCEPTORS,
    ):
        self._transports = transports
        self._interceptors = interceptors  # around the steps served here
        self._instance_id = instance_id
        self._namespace = namespace
        self._capabilities = tuple(dict.fromkeys(capabilities))
        # The secret tenants' signed tokens are checked with (None: unsigned tenants).
        self._secret = (
            tenant_token_secret.encode()
            if isinstance(tenant_token_secret, str)
            else tenant_token_secret
        )
        self._step_threads = step_threads
        self._max_payload_bytes = max_payload_bytes
        self._started_at = int(time.time() * 1000)
        self.remote = RemoteSteps(
            transports, control_plane=control_plane_descriptor(instance_id, namespace)
        )
        self._servers: list[StepServer] = []
        self._gateway: Gateway | None = None

    @property
    def pool(self) -> TransportPool:
        return self._transports

    def directories(self) -> list[tuple[str, WorkerDirectory]]:
        """The members of the pool that can say which workers are live, by id."""
        return [(i, d) for i, t in self._transports.members if (d := t.directory) is not None]

    async def consume_results(self, sink: ResultSink) -> None:
        """Take step results (and everything else the pool delivers to a control plane)."""
        await self._transports.start(sink)

    async def open_gateway(
        self,
        plane: ControlPlane,
        watchers: RunWatchers,
        subscribe: Subscribe,
        *,
        worker_health: WorkerHealthRead | None = None,
    ) -> None:
        """Answer tenants (start-run messages, run requests) over the first member that
        carries the gateway, if any."""
        channel = next(
            (m.gateway for _, m in self._transports.members if m.gateway is not None), None
        )
        if channel is None:
            return
        self._gateway = Gateway.for_plane(
            plane,
            watchers,
            channel,
            settings=GatewaySettings(
                secret=self._secret, max_payload_bytes=self._max_payload_bytes
            ),
            subscribe=subscribe,
            worker_health=worker_health,
        )
        await self._gateway.start()

    async def serve_steps(
        self,
        names: Sequence[str],
        definition: Callable[[str], Step[Any, Any] | None],
        executor: Callable[[], ThreadPoolExecutor],
    ) -> None:
        """Serve the steps `names` on every member, announcing this process's descriptor."""
        tokens = sorted({step_token(name, self._namespace) for name in names})
        if not tokens:
            return
        service = StepService(
            definition, executor, interceptors=self._interceptors, namespace=self._namespace
        )
        descriptor = self._descriptor(sorted(names))
        for _, transport in self._transports.members:
            server = await transport.step_server(
                tokens, service, concurrency=self._step_threads, descriptor=descriptor
            )
            self._servers.append(server)

    def _descriptor(self, steps: list[str]) -> WorkerDescriptor:
        """What this process announces as a step worker: the steps it serves and the
        capabilities it was given (`Engine(capabilities=…)`), which capability routing reads."""
        return WorkerDescriptor(
            instance_id=self._instance_id,
            runtime="python",
            sdk=SdkInfo(name="durably", version=DURABLY_VERSION),
            protocol=LEGACY_V1_PROTOCOL,
            capabilities=self._capabilities,
            workflows=(),
            steps=tuple(steps),
            namespace=self._namespace if self._namespace not in (None, "", "default") else None,
            started_at=self._started_at,
        )

    async def broadcast_cancel(self, run_id: str) -> None:
        """Tell the workers running the run's steps (best effort: a worker that misses it
        finishes its step, whose late result the cancelled run then ignores)."""
        for member_id, member in self._transports.members:
            control = member.control
            if control is None:
                continue
            try:
                await control.cancel_run(run_id)
            except Exception as exc:
                log.warning(
                    "could not broadcast the cancel of %s on %r: %s", run_id, member_id, exc
                )

    async def drain(self, timeout: float) -> None:
        """Stop serving steps; those running get `timeout` seconds to answer."""
        servers, self._servers = self._servers, []
        for server in servers:
            await server.drain(timeout)

    async def close(self, timeout: float) -> None:
        """Close the gateway (its requests in flight get `timeout` seconds), then the pool."""
        gateway, self._gateway = self._gateway, None
        if gateway is not None:
            await gateway.close(timeout)
        await self._transports.close()
