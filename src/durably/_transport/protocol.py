"""The contract between the engine and a transport that carries steps to other processes.

A transport moves two things: step tasks (`RemoteTask`) from an engine to whichever worker
serves the step's routing token, and step results (`StepResult`) back to any engine of the
fleet. It never touches the store. Both directions are at-least-once: a dispatched task may run
twice (a worker died after running it; the broker re-delivers), a result may arrive twice, and
the engine's compare-and-set on the `pending` checkpoint (`save_checkpoints_if_pending`) makes a
duplicate harmless. What neither side may do is lose one: `dispatch` returns only once the broker
holds the task, and a transport acknowledges a result only after `ResultSink.step_results`
returned (the checkpoint is durable by then).

The engine side is `Transport`; the serving side (a `durably worker`, or an engine that also
serves its own steps) is `StepServer`, obtained from `Transport.step_server`. Capabilities beyond
steps (workflow turns, heartbeats and worker descriptors, control messages) are declared on
`Transport.features`; a transport that lacks one says so there, and the engine refuses the
feature by name instead of emulating it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from durably._core.bounds import DEFAULT_MAX_PAYLOAD_BYTES
from durably._core.handshake import WorkerDescriptor
from durably._core.wire import RemoteTask, StepResult

__all__ = [
    "ControlChannel",
    "GatewayChannel",
    "MessageListener",
    "ResultSink",
    "RunRequestHandler",
    "StartRunHandler",
    "StepHandler",
    "StepServer",
    "TenantChannel",
    "Transport",
    "TransportFeatures",
    "TransportUnavailableError",
    "TurnChannel",
    "TurnSink",
    "WorkerBeatView",
    "WorkerDirectory",
    "result_size_limit",
]


class TransportUnavailableError(ConnectionError):
    """The broker behind a transport could not take or give a message (names it and why)."""


class ResultSink(Protocol):
    """Where a transport hands the step results it consumes (the engine's result settler)."""

    @property
    def max_payload_bytes(self) -> int:
        """The most bytes of JSON one result may have (the engine's `max_payload_bytes`): a
        transport that sees a result's bytes refuses a bigger one before parsing it."""
        ...

    async def step_results(self, results: Sequence[StepResult]) -> None:
        """Apply the results durably. Returns once every result is written or known to be a
        duplicate; raises when it could not (the transport must then keep or redeliver the
        results it was given)."""
        ...


def result_size_limit(sink: ResultSink) -> int:
    """The most bytes of JSON a result handed to `sink` may have: the sink's
    `max_payload_bytes` (the engine's settler carries the engine's option). A transport
    that sees a result's bytes refuses a bigger one before parsing it
    (`parse_step_result(..., max_bytes=…)`)."""
    limit = sink.max_payload_bytes
    # The sink is the engine's, but a value that is not a positive whole number must not
    # turn the bound off.
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        return limit
    return DEFAULT_MAX_PAYLOAD_BYTES


StepHandler = Callable[[RemoteTask], Awaitable[StepResult]]
"""Runs one step task on a serving process and returns its result (never raises: a handler's
failure is a failed result)."""


@dataclass(frozen=True, slots=True)
class TransportFeatures:
    """What a transport carries besides step tasks and results."""

    workflow_turns: bool = False
    """Remote workflow turns (`WorkflowTask` → `WorkflowDecision`)."""
    worker_descriptors: bool = False
    """Workers announce heartbeats and descriptors (capability routing, announced routes)."""
    control_messages: bool = False
    """Broadcast control messages (cancellation reaches running workers)."""


class TurnSink(Protocol):
    """Where a transport hands what workflow workers send back about remote turns (the
    engine's turn applier). Messages arrive as parsed JSON objects; the sink validates them
    (the wire shapes of turns live with the engine's turn logic). Like `ResultSink`, each
    method returns only once the effect is durable, and raises when it is not."""

    async def decisions(self, decisions: Sequence[dict[str, object]]) -> None: ...

    async def step_events(self, events: Sequence[dict[str, object]]) -> None: ...

    async def run_heartbeats(self, beats: Sequence[dict[str, object]]) -> None: ...


class TurnChannel(Protocol):
    """Remote workflow turns: tasks out to workflow workers, decisions and step events back.
    Present on a transport whose `features.workflow_turns` is True."""

    async def dispatch_turn(self, task: dict[str, object], *, token: str) -> None:
        """Queue a WorkflowTask (JSON object) on `token`; returns once the broker holds it."""
        ...

    async def start_turns(self, sink: TurnSink) -> None:
        """Start consuming decisions, step events and run heartbeats into `sink`."""
        ...


class WorkerBeatView(Protocol):
    """One live worker's liveness entry on one routing token, already read by the transport
    (a value it could not read still counts: the entry's presence means the worker is alive)."""

    @property
    def token(self) -> str: ...

    @property
    def instance_id(self) -> str: ...

    @property
    def last_beat_at(self) -> int:
        """Epoch ms of its last refresh; 0 when the value could not be read."""
        ...

    @property
    def status(self) -> Mapping[str, Any] | None:
        """What the worker reports about itself (concurrency, in flight, …), untrusted JSON."""
        ...

    @property
    def descriptor_hash(self) -> str | None:
        """The content hash of the descriptor it publishes next to this entry, if any."""
        ...


class WorkerDirectory(Protocol):
    """What live workers say about themselves on a transport that carries heartbeats and
    descriptors (`features.worker_descriptors`)."""

    async def list_worker_groups(self) -> set[str]:
        """Every routing token some live worker beats on."""
        ...

    async def read_worker_descriptors(self, token: str | None = None) -> list[dict[str, Any]]:
        """The raw descriptors (JSON objects) live workers publish on `token` (all: None, then
        one per instance id)."""
        ...

    async def read_worker_heartbeats(self, token: str | None = None) -> Sequence[WorkerBeatView]:
        """The liveness entries of `token`'s live workers (every token's: None)."""
        ...

    async def queue_depth(self, token: str) -> int:
        """Tasks queued on `token` and not finished yet (waiting, running, delayed)."""
        ...


class ControlChannel(Protocol):
    """Broadcast control messages to every worker and engine on the transport
    (`features.control_messages`)."""

    async def cancel_run(self, run_id: str) -> None:
        """Tell running workers the run was cancelled (a cooperative abort: a step sees it at
        its next check; the store's state is what makes the cancel final)."""
        ...


# ------------------------------------------------------------------ the tenant gateway

# The gateway lets store-less processes (tenants, durable-worker's `start_run`) start runs and
# ask the control plane about their own runs; the engine side is `durably._engine.gateway.server`.

StartRunHandler = Callable[[dict[str, Any], str], Awaitable[None]]
RunRequestHandler = Callable[[dict[str, Any], str], Awaitable[dict[str, Any] | None]]
MessageListener = Callable[[dict[str, Any]], Awaitable[None] | None]


class GatewayChannel(Protocol):
    """The control plane's end of the gateway on a transport (`RedisGatewayChannel`)."""

    async def serve(self, start_runs: StartRunHandler, run_requests: RunRequestHandler) -> None:
        """Consume start-run messages and run requests (the job id passed for logs). A
        start-run handler raises to have its message retried; a run-request handler's
        answer is published as the reply."""
        ...

    async def publish_tenant_event(self, tenant: str, message: Mapping[str, Any]) -> None: ...

    async def close(self, grace_s: float = 5.0) -> None: ...


class TenantChannel(Protocol):
    """A tenant's end of the gateway on a transport (`RedisGatewayChannel`)."""

    async def start_run(self, message: Mapping[str, Any]) -> None: ...

    async def send_request(self, request: Mapping[str, Any]) -> None: ...

    async def subscribe_replies(
        self, listener: MessageListener
    ) -> Callable[[], Awaitable[None]]: ...

    async def subscribe_tenant_events(
        self, tenant: str, listener: MessageListener
    ) -> Callable[[], Awaitable[None]]: ...

    async def close(self, grace_s: float = 5.0) -> None: ...


class StepServer(Protocol):
    """Serves step tasks on a set of routing tokens until drained."""

    async def drain(self, timeout: float) -> None:
        """Stop taking tasks; wait up to `timeout` seconds for those in flight to answer."""
        ...


class Transport(Protocol):
    """One broker connection of an engine (a member of its transport pool)."""

    @property
    def kind(self) -> str:
        """`redis`, `sql`, … — for messages and health."""
        ...

    @property
    def features(self) -> TransportFeatures: ...

    async def start(self, sink: ResultSink) -> None:
        """Connect and start consuming results into `sink` (idempotent)."""
        ...

    async def close(self) -> None:
        """Stop consuming and disconnect; results not yet consumed stay in the broker."""
        ...

    async def dispatch(self, task: RemoteTask) -> None:
        """Hand a step task to the broker; returns once the broker holds it. Raises
        `TransportUnavailableError` when it cannot (the caller may try another member)."""
        ...

    async def step_server(
        self,
        tokens: Sequence[str],
        handler: StepHandler,
        *,
        concurrency: int,
        descriptor: WorkerDescriptor | None = None,
    ) -> StepServer:
        """Start serving step tasks queued on `tokens` with `handler`, at most `concurrency`
        at once, publishing each result; returns the running server. `descriptor` is what the
        server announces about itself where the transport carries descriptors (capability
        routing reads it); elsewhere it is not sent."""
        ...

    @property
    def turns(self) -> TurnChannel | None:
        """The workflow-turn channel (None unless `features.workflow_turns`)."""
        ...

    @property
    def gateway(self) -> GatewayChannel | None:
        """The tenant gateway's messages (None on a transport that does not carry them)."""
        ...

    @property
    def control(self) -> ControlChannel | None:
        """Broadcast control messages (None unless `features.control_messages`)."""
        ...

    @property
    def directory(self) -> WorkerDirectory | None:
        """The live workers' heartbeats and descriptors (None unless
        `features.worker_descriptors`)."""
        ...

    @property
    def redis_server(self) -> tuple[str, str] | None:
        """The Redis URL and key prefix this transport uses (None unless it is on Redis): what
        `Engine(admission="redis")` counts its queues' slots on, so a fleet that shares a Redis
        transport shares its admission state with no second setting to keep in step."""
        ...
