"""`Worker`: the worker runtime of one process — everything that executes runs.

An `Engine` is a `Client` (start, signal, cancel, read) composed with a `Worker`. The
worker builds its parts and hands each its collaborators explicitly:

- `Dispatcher` (dispatcher.py): which runs execute here, one turn of a run at a time, and
  the background tasks of this process;
- `TurnDriver` (turn_driver.py): lease → one turn of a run's body → settle;
- `Poller` (poller.py): pick-up of pending runs, recovery of runs whose owner died, due
  timers, execution timeouts, lease renewal and the drain;
- `Router` (router.py): onError handoffs;
- `Deliveries` (deliveries.py) and `ChildMailbox` (mailbox.py): waking runs and delivering
  child completions in batches;
- `WakeLink` (wakes.py): this process's end of the store's wake bus;
- `InProcessTransport` (run/in_process.py): where step handlers run;
- `ControlPlane` (control/plane.py): the store-level operations its client uses;
- `FleetLink` (fleet.py): with a transport, this process's ends of it — step dispatch, the
  steps it serves, the tenant gateway and the cancel broadcast.

The roles the worker plays for those parts are small objects of their own (hosts.py), each
handed only to the parts that need that role: what a run executing here sees
(`ExecutionHost`, a `run.host.RunHost`), how runs are settled (`Settling`, a
`saga.CancelHost`), the local side of the control plane (`LocalHooks`, a
`plane.LocalRuns`), the registrations and the runs started from inside the runtime. The
worker itself is what the `Engine` uses, and the host of the event accumulators.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from durably._core.admission import Queue
from durably._core.log_context import durably_logger
from durably._core.models import JSONValue, WorkflowRun
from durably._engine.client.handle import RunWatchers
from durably._engine.control.plane import ControlPlane
from durably._engine.control.start import StartRequest
from durably._engine.defs.events import EngineEvent, EventBus
from durably._engine.defs.intercept import NO_INTERCEPTORS, Interceptors
from durably._engine.defs.registry import Registry, Step, Workflow
from durably._engine.flow.queues import AdmissionSpec, FlowControl, admission_backend
from durably._engine.gateway.server import WorkerHealth as WorkerHealthRead
from durably._engine.remote.turns import RemoteTurns
from durably._engine.run.in_process import InProcessTransport
from durably._engine.run.resident import ResidentSet
from durably._engine.worker.beats import WorkerBeats
from durably._engine.worker.dead_letters import DeadLetters
from durably._engine.worker.deliveries import Deliveries
from durably._engine.worker.dispatcher import Dispatcher
from durably._engine.worker.fleet import FleetLink
from durably._engine.worker.hosts import (
    ExecutionHost,
    Listeners,
    LocalHooks,
    Registrations,
    RunStarts,
    Settling,
)
from durably._engine.worker.mailbox import ChildMailbox
from durably._engine.worker.poller import Poller
from durably._engine.worker.roles import Role, announce_role
from durably._engine.worker.router import Router
from durably._engine.worker.settler import ResultSettler
from durably._engine.worker.turn_driver import TurnDriver
from durably._engine.worker.wakes import WakeLink
from durably._read.lists import LocalWorker

if TYPE_CHECKING:
    from durably._engine.control.signals import SignalBufferPolicy
    from durably._engine.defs.options import EngineOptions
    from durably._store.protocol import InstanceHold, StateStore
    from durably._transport.pool import TransportPool
    from durably._transport.protocol import WorkerDirectory

log = durably_logger("durably.worker")

__all__ = ["Worker"]


class Worker:
    """The runs this process executes, and everything executing them needs."""

    def __init__(
        self,
        store: StateStore,
        *,
        options: EngineOptions,
        namespace: str | None,
        drive_runs: bool,
        instance_id: str,
        role: Role = "both",
        role_given: bool = True,
        hold_instance: bool,
        clock: Callable[[], int],
        signal_buffer: SignalBufferPolicy,
        workflows: Registry,
        steps: Registry | None,
        tenant_token_secret: str | bytes | None = None,
        transports: TransportPool | None = None,
        capabilities: Sequence[str] = (),
        queues: Iterable[Queue] = (),
        admission: AdmissionSpec = "auto",
        dead_letter_workflow: Workflow[Any, Any] | str | None = None,
        interceptors: Interceptors = NO_INTERCEPTORS,
    ):
        self._store = store
        self._options = options
        self._namespace = namespace
        # The role (roles.py): a step worker drives no run and takes nothing but its steps'
        # tasks; a control plane serves no step.
        self._role = role
        self._role_given = role_given
        self._serves_steps = drive_runs and role != "control"
        drive_runs = drive_runs and role != "worker"
        self._transports = transports
        self._instance_id = instance_id
        self._hold_instance = hold_instance
        self._clock = clock
        self._registrations = registrations = Registrations(workflows, steps)
        self._events = events = EventBus()
        self._watchers = RunWatchers()
        events.on_run_events(self._wake_watchers)
        self._dead = Listeners[WorkflowRun]("on_dead")
        cancelled = self._cancelled = Listeners[str]("on_cancel")
        self._executor: ThreadPoolExecutor | None = None
        self._background: list[asyncio.Task[Any]] = []
        self._instance: InstanceHold | None = None
        self._health_read: WorkerHealthRead | None = None
        fleet = self._fleet = (
            FleetLink(
                transports,
                instance_id=instance_id,
                namespace=namespace,
                capabilities=capabilities,
                tenant_token_secret=tenant_token_secret,
                step_threads=options.step_threads,
                max_payload_bytes=options.max_payload_bytes,
                interceptors=interceptors,
            )
            if transports is not None
            else None
        )

        resident = ResidentSet(options.max_resident_runs, on_idle=self._after_turn)
        dispatcher = self._dispatcher = Dispatcher(store, drive_runs=drive_runs, idle=resident.idle)
        # The pick-up a wake message starts is the poller's, built below with the
        # settle role, which needs the wake link first.
        wakes = self._wakes = WakeLink(
            store, dispatcher, on_settled=self._watchers.wake, pickup=self._pickup
        )
        mailbox = ChildMailbox(store, dispatcher, clock=clock)
        deliveries = self._deliveries = Deliveries(
            store,
            clock=clock,
            signal_buffer=signal_buffer,
            runs=dispatcher,
            wakes=wakes,
            mailbox=mailbox,
        )
        mailbox.connect(deliveries)
        settling = self._settling = Settling(store, events, wakes, deliveries, cancelled)
        plane = self._plane = ControlPlane(
            store,
            clock=clock,
            signal_buffer=signal_buffer,
            announce=wakes.announce,
            namespace=namespace,
            local=LocalHooks(
                dispatcher,
                registrations,
                wakes,
                deliveries,
                events,
                cancelled,
                max_concurrent_runs=options.max_concurrent_runs,
                fleet=fleet,
            ),
        )
        starts = self._starts = RunStarts(
            plane,
            registrations,
            deliveries,
            dispatcher,
            clock=clock,
            namespace=namespace,
            instance_id=instance_id,
        )
        poller = self._poller = Poller(
            store,
            dispatcher,
            settle=settling,
            plane=plane,
            options=options,
            clock=clock,
            instance_id=instance_id,
            namespace=namespace,
            signal_buffer=signal_buffer,
            workflows=registrations.registered_workflows,
            on_dead=self._dead.fire,
            dead_letter=DeadLetters(registrations, starts, dead_letter_workflow).start,
        )
        flow = self._flow = FlowControl(
            admission_backend(admission, store, owner=instance_id, clock=clock),
            queues=queues,
            runs=dispatcher,
            redrive=deliveries.redrive,
            spawn=dispatcher.spawn,
        )
        events.on_run_events(flow.on_run_event)
        router = self._router = Router(
            settling,
            dispatcher,
            clock=clock,
            fallback_wake_at=self.fallback_wake_at,
            registration=registrations.registration,
            workflows=registrations.registered_workflows,
            start_child=starts.start_child_soon,
        )
        turns = self._turns = self._remote_turns(transports)
        if turns is not None:
            router.connect(turns.announced_routes)
            poller.serve_by_convention(turns.serves_workflow)
            starts.connect(turns)
        host = ExecutionHost(
            store=store,
            options=options,
            events=events,
            resident=resident,
            transport=InProcessTransport(lambda: self.executor),
            remote=fleet.remote if fleet is not None else None,
            capabilities=capabilities,
            wakes=wakes,
            flow=flow,
            namespace=namespace,
            instance_id=instance_id,
            executor=lambda: self.executor,
            clock=clock,
            fallback_wake_at=self.fallback_wake_at,
            registrations=registrations,
            starts=starts,
            plane=plane,
            runs=dispatcher,
            claims=poller,
            mailbox=mailbox,
            interceptors=interceptors,
        )
        self._driver = TurnDriver(
            host,
            settling,
            dispatcher,
            router,
            clock=clock,
            lease_ms=options.lease_ms,
            instance_id=instance_id,
            namespace=namespace,
            registration=registrations.registration,
            fallback_wake_at=self.fallback_wake_at,
            continue_as=starts.continue_as,
            remote=turns,
            interceptors=interceptors,
        )
        dispatcher.connect(self._driver, nudge=deliveries.nudge, after_turn=self._after_turn)
        # Its heartbeat row: only a process that drives runs or serves steps is a worker.
        self._beats = (
            WorkerBeats(
                store,
                instance_id=instance_id,
                namespace=namespace,
                served=self._served_now,
                directories=self.worker_directories,
            )
            if drive_runs or self._serves_steps
            else None
        )
        self._results = ResultSettler(
            store,
            dispatcher,
            deliveries,
            events,
            clock=clock,
            release=flow.release_settled,
            max_payload_bytes=options.max_payload_bytes,
        )

    def _remote_turns(self, transports: TransportPool | None) -> RemoteTurns | None:
        """Remote workflow turns, over the first member of the pool that carries them (with
        that member's worker directory, when it has one); None without such a member."""
        if transports is None:
            return None
        for _, member in transports.members:
            channel = member.turns
            if member.features.workflow_turns and channel is not None:
                return RemoteTurns(
                    self._settling,
                    self._router,
                    self._deliveries,
                    self._plane,
                    channel=channel,
                    directory=member.directory,
                    steps=transports,
                    registration=self._registrations.registration,
                    start_registered=self._starts.start_registered_child,
                    spawn=self._dispatcher.spawn,
                    clock=self._clock,
                    fallback_wake_at=self.fallback_wake_at,
                    instance_id=self._instance_id,
                    namespace=self._namespace,
                    lease_ms=self._options.lease_ms,
                    max_payload_bytes=self._options.max_payload_bytes,
                )
        return None

    # ================================================================== what others read

    @property
    def store(self) -> StateStore:
        return self._store

    @property
    def options(self) -> EngineOptions:
        return self._options

    @property
    def events(self) -> EventBus:
        return self._events

    @property
    def flow(self) -> FlowControl:
        return self._flow

    @property
    def namespace(self) -> str | None:
        return self._namespace

    @property
    def instance_id(self) -> str:
        return self._instance_id

    @property
    def drive_runs(self) -> bool:
        return self._dispatcher.drive_runs

    @property
    def serves_steps(self) -> bool:
        return self._serves_steps and self._fleet is not None

    @property
    def plane(self) -> ControlPlane:
        """The control-plane operations of this process, with this worker's local hooks."""
        return self._plane

    @property
    def settling(self) -> Settling:
        """How runs are settled here (what remote workflow turns are given)."""
        return self._settling

    @property
    def watchers(self) -> RunWatchers:
        """The `wait_for_run` calls of this process (woken by its events and wake bus)."""
        return self._watchers

    @property
    def deliveries(self) -> Deliveries:
        """How runs here are woken and signals delivered (the internal signal route)."""
        return self._deliveries

    @property
    def poller(self) -> Poller:
        return self._poller

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The worker's own thread pool for sync user code (never the loop's default)."""
        if self._executor is None:
            raise RuntimeError("the engine is not open")
        return self._executor

    def clock(self) -> int:
        return self._clock()

    def fallback_wake_at(self) -> int | None:
        """The reconcile safety-net wake for event-waiting suspends (signal, event, child,
        handoff): a lost wake is re-driven by the timer poller. None when disabled."""
        reconcile = self._options.reconcile_ms
        return self._clock() + reconcile if reconcile > 0 else None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a coroutine in the background, tracked by the dispatcher."""
        return self._dispatcher.spawn(coro)

    def local_worker(self) -> LocalWorker | None:
        """This process as a worker in `worker_health` (None when it does not drive)."""
        if not self.drive_runs:
            return None
        return LocalWorker(
            self._instance_id, self._options.max_concurrent_runs, self._dispatcher.executing_count
        )

    def report_health_with(self, health: WorkerHealthRead) -> None:
        """How this worker's tenant gateway answers `workerHealth`: the engine's own read
        (set by the engine before it opens; without it the verb is refused)."""
        self._health_read = health

    def _served_now(self) -> tuple[list[tuple[str, str]], list[str]]:
        """What this worker's heartbeat row says it serves: the workflows it drives (every
        registered version) and the steps it runs."""
        workflows = (
            [(wf.name, wf.version) for wf in self._registrations.registered_workflows()]
            if self.drive_runs
            else []
        )
        steps = self._registrations.served_steps() if self._serves_steps else []
        return workflows, steps

    def worker_directories(self) -> list[tuple[str, WorkerDirectory]]:
        """The members of the transport pool that can say which workers are live, by id."""
        return self._fleet.directories() if self._fleet is not None else []

    def turn_running(self, run_id: str) -> bool:
        """A turn of the run executes here and its body is not parked (tests wait for it
        to end before they deliver, to exercise one path at a time)."""
        execution = self._dispatcher.execution(run_id)
        return execution is not None and not execution.is_parked

    def poll_interval(self, run_id: str) -> float:
        """How often a `wait_for_run` on this run re-reads it without a wake: runs driven
        here announce changes through events, runs driven elsewhere through the wake bus
        when the store has one; polling is the fallback."""
        if self._dispatcher.execution(run_id) is not None:
            return 5.0
        return 1.0 if self._wakes.active else 0.25

    # ================================================================== lifecycle

    async def open(self) -> None:
        """Take the instance id (when one was given), start the thread pool, the wake bus
        and the background loops."""
        if self._hold_instance and self.drive_runs:
            await self._take_instance()
        self._executor = ThreadPoolExecutor(
            max_workers=self._options.step_threads, thread_name_prefix="durably-step"
        )
        self._dispatcher.reopen()
        await self._wakes.open()
        announce_role(
            self._instance_id,
            self._role,
            given=self._role_given,
            namespace=self._namespace,
            transports=None if self._transports is None else self._transports.members,
            no_workflows=self._registrations.none_given,
        )
        fleet = self._fleet
        if fleet is not None:
            if self._role != "worker":
                await fleet.consume_results(self._results)
                if self._turns is not None:
                    await self._turns.start()
                # Only an engine that runs workflows answers tenants: a step worker must
                # never take a start-run, which its store could not hold for the fleet.
                await fleet.open_gateway(
                    self._plane,
                    self._watchers,
                    self._events.subscribe,
                    worker_health=self._health_read,
                )
            if self._serves_steps:
                # Every engine but a control plane is a worker for its own steps (`steps=[]`
                # serves none).
                await fleet.serve_steps(
                    self._registrations.served_steps(),
                    self._registrations.step_definition,
                    lambda: self.executor,
                )
        if self._beats is not None:
            # After the step servers and the result consumers are up: the row says what
            # this process serves, so a start by name right after it opened is judged by it.
            await self._beats.open()
        if self.drive_runs:
            self._background = [
                asyncio.create_task(self._poller.poll_loop(), name="durably-poller"),
                asyncio.create_task(self._poller.lease_loop(), name="durably-leases"),
            ]
        self._router.warn_unserved()  # boot-time warning, never raises

    async def _take_instance(self) -> None:
        """A restart with the same instance_id: once the previous incarnation is provably
        gone (the store's instance hold), its leases are void and its runs ours at once. A
        LIVE predecessor (a rolling restart) is waited for — two live processes never share
        an instance_id, which would let each renew and release the other's leases."""
        loop = asyncio.get_running_loop()
        wait_ms = self._options.effective_instance_wait_ms
        deadline = loop.time() + wait_ms / 1000.0
        while True:
            self._instance = await self._store.hold_instance(self._instance_id)
            if self._instance is not None:
                break
            if loop.time() >= deadline:
                raise RuntimeError(
                    f"instance_id {self._instance_id!r} is held by another live process; "
                    f"gave up after {wait_ms}ms (give each live process its own instance_id, "
                    "or stop the other one first)"
                )
            await asyncio.sleep(0.05)
        await self._store.release_locks_of(self._instance_id)

    async def drain(self, timeout: float) -> None:
        """Stop taking work, evict parked runs, wait for turns to finish (or `timeout`)."""
        if self._fleet is not None:
            await self._fleet.drain(timeout)
        await self._poller.drain(timeout)

    async def close(self, drain_timeout: float) -> None:
        """Drain, stop the loops and the wake bus, release the instance id, cancel the
        background deliveries still running, stop the thread pool."""
        if self._beats is not None:
            await self._beats.close()  # first: a start from now on must not count on us
        await self.drain(drain_timeout)
        if self._fleet is not None:
            await self._fleet.close(drain_timeout)
        await self._flow.close()
        await self._wakes.close()
        if self._instance is not None:
            hold, self._instance = self._instance, None
            await hold.release()
        for task in self._background:
            task.cancel()
        for task in self._background:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._background = []
        # Background deliveries still running after the drain's grace period would use the
        # store after it closed (and reopen its connection, never to be closed again):
        # cancel them; what they did not deliver, the parents' replays recover
        # (children.recover_completions).
        await self._dispatcher.cancel_tasks()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def wait_idle(self, timeout: float | None) -> None:
        await self._dispatcher.wait_idle(timeout)

    async def resume(self, run_id: str) -> None:
        """Run a turn of the run here now (once its lease is free)."""
        await self._driver.run_one(run_id)

    # ================================================================== registry

    def register(self, item: Workflow[Any, Any] | Step[Any, Any]) -> None:
        self._registrations.register(item)

    def registration(self, name: str, version: str | None = None) -> Workflow[Any, Any] | None:
        return self._registrations.registration(name, version)

    def registered_workflows(self) -> list[Workflow[Any, Any]]:
        return self._registrations.registered_workflows()

    def latest_workflows(self) -> list[Workflow[Any, Any]]:
        return self._registrations.latest_workflows()

    def resolve(
        self, workflow: Workflow[Any, Any] | str, version: str | None
    ) -> Workflow[Any, Any]:
        return self._registrations.resolve(workflow, version)

    def prepare_input(self, workflow: Workflow[Any, Any], input: Any) -> JSONValue:
        """Validate a start input against the workflow's annotation/validator → JSON."""
        return self._registrations.prepare_input(workflow, input)

    def unserved_on_error_routes(self) -> list[dict[str, Any]]:
        return self._router.unserved_on_error_routes()

    # ================================================================== starting runs

    async def create_run(
        self, wf: Workflow[Any, Any], json_input: JSONValue, request: StartRequest
    ) -> str:
        return await self._starts.create_run(wf, json_input, request)

    def start_child_soon(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        child_id: str,
        parent: WorkflowRun,
        version: str | None,
        priority: int | None,
    ) -> None:
        """Start a child run after the current turn (`RunStarts.start_child_soon`)."""
        self._starts.start_child_soon(workflow, input, child_id, parent, version, priority)

    async def publish_event(
        self, name: str, payload: Any = None, *, id: str | None = None, buffer: bool = True
    ) -> int:
        return await self._starts.publish_event(name, payload, id=id, buffer=buffer)

    async def start_served_elsewhere(self, input: Any, request: StartRequest) -> str:
        """A run of a workflow not registered here that the fleet serves
        (`RunStarts.start_served_elsewhere`)."""
        return await self._starts.start_served_elsewhere(input, request)

    # ================================================================== listeners

    def on_dead(self, listener: Callable[[WorkflowRun], Any]) -> Callable[[], None]:
        return self._dead.add(listener)

    def on_cancel(self, listener: Callable[[str], Any]) -> Callable[[], None]:
        return self._cancelled.add(listener)

    # ================================================================== internals

    async def _pickup(self) -> None:
        await self._poller.pickup()

    def _after_turn(self) -> None:
        if self._poller.backlogged:
            self._wakes.kick()  # room for more of the pending backlog

    def _wake_watchers(self, event: EngineEvent) -> None:
        # run.started never settles a run: waking on it would only cost a store read.
        if event.type == "run.completed":
            self._watchers.completed(event.run_id, event.output)
        elif event.type.startswith("run.") and event.type != "run.started":
            self._watchers.wake(event.run_id)
