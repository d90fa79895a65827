"""`durably.Engine`: start runs, drive them, signal them, observe them."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Never, TypeVar

from durably._core.durations import Duration
from durably._core.errors import (
    RunNotFoundError,
    WorkflowNotFoundError,
)
from durably._core.ids import given_run_id
from durably._core.models import (
    JSONValue,
    RunResult,
    SignalWaiter,
    StepCheckpoint,
    WorkflowRun,
    replace,
)
from durably._engine import driver, operator, poller, publish, routing, signals, unsupported
from durably._engine.children import ChildMailbox
from durably._engine.client import Client
from durably._engine.client import prepare_input as validated_input
from durably._engine.control import ControlPlane
from durably._engine.engine_hooks import EngineRuns
from durably._engine.events import EngineEvent, EventBus, Listener, MetricsSnapshot
from durably._engine.execution import Execution, ResidentSet
from durably._engine.handle import RunHandle, WaitUntil, is_settled
from durably._engine.options import OPTION_NAMES, UNSET, EngineOptions, Unset, merge_options
from durably._engine.read_api import ReadApi, WorkerHealthApi
from durably._engine.registry import DEFAULT_REGISTRY, Registry, Step, Workflow
from durably._engine.signal_api import (
    BufferedSignalsApi,
    SignalApi,
    buffer_policy,
)
from durably._engine.stores import open_store
from durably._engine.transport import InProcessTransport
from durably._engine.unsupported import refuse_engine_options
from durably._engine.vocab import parent_tag
from durably._engine.wakes import WakeLink
from durably._store.codec import Codec, wrap_store
from durably._store.protocol import InstanceHold, StateStore

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("durably")

I = TypeVar("I")
O = TypeVar("O")


class Engine(ReadApi, WorkerHealthApi, SignalApi, BufferedSignalsApi):
    """The durable workflow engine.

    `Engine()` uses the embedded SQLite default (`DURABLY_STORE`, else `sqlite:///durably.db`).
    Use it as `async with Engine(...) as engine:` so pollers, recovery and drain run; calls
    made before that open it lazily.

    Options: every tuning option is a typed keyword here and a documented field of
    `EngineOptions` (see it for each option's meaning and default). `*_ms` options are
    whole milliseconds; `signal_buffer_ttl` is seconds, a `timedelta` or a string such as
    "24h". Pass keywords, an `options=EngineOptions(...)` value, or both: a keyword given
    here overrides the same field of `options`. Every value is checked here and a bad one
    raises `ValueError` naming it; an option of a feature durably does not have yet
    (`schedules=`, `retention=`, …) raises `NotImplementedError` naming the feature, and a
    misspelt one a `TypeError` suggesting the right name. `engine.options` holds the
    result.
    """

    def __init__(
        self,
        store: StateStore | AsyncEngine | str | None = None,
        # Declared so that a transport passed positionally is refused by name below (and
        # by mypy): remote transports are planned, steps run in-process today.
        transport: None = None,
        *,
        workflows: Iterable[Workflow[Any, Any]] | None = None,
        steps: Iterable[Step[Any, Any]] | None = None,
        namespace: str | None = "default",
        drive: bool = True,
        instance_id: str | None = None,
        clock: Callable[[], int] | None = None,
        codec: Codec | None = None,
        options: EngineOptions | None = None,
        # The tuning options, each documented on `EngineOptions`. UNSET means "take it from
        # `options` (or the default)", so an explicit keyword always wins over `options`.
        lease_ms: int | Unset = UNSET,
        timer_poll_ms: int | Unset = UNSET,
        reconcile_ms: int | Unset = UNSET,
        max_recovery_attempts: int | Unset | None = UNSET,
        drain_timeout_ms: int | Unset = UNSET,
        instance_wait_ms: int | Unset | None = UNSET,
        max_concurrent_runs: int | Unset = UNSET,
        claim_batch: int | Unset = UNSET,
        pending_batch: int | Unset = UNSET,
        max_resident_runs: int | Unset = UNSET,
        step_threads: int | Unset = UNSET,
        fan_window: int | Unset = UNSET,
        fold_fans_over: int | Unset = UNSET,
        event_scan_limit: int | Unset = UNSET,
        compensation_retries: int | Unset = UNSET,
        track_step_start: bool | Unset = UNSET,
        always_replay: bool | Unset = UNSET,
        signal_buffer_ttl: Duration | Unset = UNSET,
        signal_buffer_per_token: int | Unset = UNSET,
        signal_buffer_per_namespace: int | Unset = UNSET,
        # Anything else is refused at run time with a message naming the planned feature
        # (`schedules=`, `retention=`, …) or the option it was probably meant to be. Typed
        # `Never` so that mypy rejects every such keyword before the code ever runs.
        **unsupported: Never,
    ):
        refuse_engine_options(unsupported, OPTION_NAMES)
        if transport is not None:
            raise NotImplementedError(
                "remote transports are not supported yet; omit `transport` to run steps in-process"
            )
        opts = merge_options(
            "Engine",
            options,
            {
                "lease_ms": lease_ms,
                "timer_poll_ms": timer_poll_ms,
                "reconcile_ms": reconcile_ms,
                "max_recovery_attempts": max_recovery_attempts,
                "drain_timeout_ms": drain_timeout_ms,
                "instance_wait_ms": instance_wait_ms,
                "max_concurrent_runs": max_concurrent_runs,
                "claim_batch": claim_batch,
                "pending_batch": pending_batch,
                "max_resident_runs": max_resident_runs,
                "step_threads": step_threads,
                "fan_window": fan_window,
                "fold_fans_over": fold_fans_over,
                "event_scan_limit": event_scan_limit,
                "compensation_retries": compensation_retries,
                "track_step_start": track_step_start,
                "always_replay": always_replay,
                "signal_buffer_ttl": signal_buffer_ttl,
                "signal_buffer_per_token": signal_buffer_per_token,
                "signal_buffer_per_namespace": signal_buffer_per_namespace,
            },
        )
        self.options = opts
        self.store, self._owns_store = open_store(store)
        self.store = wrap_store(self.store, codec)  # encrypts payloads at rest (unchanged for None)
        self.namespace = namespace
        self.drive_runs = drive
        self._explicit_instance = instance_id is not None
        self.instance_id = instance_id or f"durably-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.clock: Callable[[], int] = clock or (lambda: int(time.time() * 1000))
        # The runtime reads its options as attributes of the engine.
        self.lease_ms = opts.lease_ms
        self.timer_poll_ms = opts.timer_poll_ms
        self.reconcile_ms = opts.reconcile_ms
        self.max_recovery_attempts = opts.max_recovery_attempts
        self.drain_timeout_ms = opts.drain_timeout_ms
        self.event_scan_limit = opts.event_scan_limit
        self.track_step_start = opts.track_step_start
        self.compensation_retries = opts.compensation_retries
        self.always_replay = opts.always_replay
        self.pending_batch = opts.pending_batch
        self.max_concurrent_runs = opts.max_concurrent_runs
        self.claim_batch = opts.claim_batch
        self.fan_window = opts.fan_window
        self.fold_fans_over = opts.fold_fans_over
        # how long a restart with an explicit instance_id waits for a live predecessor
        self.instance_wait_ms = opts.effective_instance_wait_ms
        self._step_threads = opts.step_threads
        self.signal_buffer = buffer_policy(opts)

        if workflows is None:
            self._workflows = DEFAULT_REGISTRY
        else:
            self._workflows = Registry()
            for wf in workflows:
                self._workflows.add_workflow(wf)
        self._steps: Registry | None = None
        if steps is not None:
            self._steps = Registry()
            for st in steps:
                self._steps.add_step(st)

        self.transport = InProcessTransport(self)
        self.events = EventBus()
        self.events.on_run_events(self._wake_watchers)
        self.executions: dict[str, Execution] = {}
        self.resident = ResidentSet(opts.max_resident_runs)
        self.fresh_runs: dict[str, bool] = {}
        self.dispatching: set[str] = set()
        self._again: set[str] = set()
        self._claimed: dict[str, WorkflowRun] = {}
        self.wakes = WakeLink(self)
        self.mailbox = ChildMailbox(self)
        # Start, signal, cancel, retry, … are the client's; the engine adds, through its
        # hooks, what driving runs in this process needs (drive, wake, interrupt them).
        self._plane = ControlPlane(
            self.store,
            clock=self.clock,
            signal_buffer=self.signal_buffer,
            announce=self.wakes.announce,
            namespace=namespace,
            local=EngineRuns(self),
        )
        self._client = Client._for_engine(self._plane, self._ensure_open)
        self.pending_backlog = False  # run_pending stopped for lack of room (poller.py)
        self.local_backlog: deque[str] = deque()  # runs created here to claim by id
        self._instance_hold: InstanceHold | None = None
        self.draining = False
        self._watchers: dict[str, set[_RunWatch]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._background: list[asyncio.Task[Any]] = []
        self._opened = False
        self._open_lock: asyncio.Lock | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._update_validators: dict[tuple[str, str], Callable[[Any], Any]] = {}
        self._dead_listeners: list[Callable[[WorkflowRun], Any]] = []
        self._cancel_listeners: list[Callable[[str], Any]] = []
        self._idle = asyncio.Event()
        self._idle.set()

    # ================================================================== lifecycle

    async def __aenter__(self) -> Engine:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Prepare the store and start the background loops (idempotent)."""
        if self._opened:
            return
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._opened:
                return
            await self.store.ensure_schema()
            if self._explicit_instance and self.drive_runs:
                await self._take_instance()
            self._executor = ThreadPoolExecutor(
                max_workers=self._step_threads, thread_name_prefix="durably-step"
            )
            self.draining = False
            await self.wakes.open()
            if self.drive_runs:
                self._background = [
                    asyncio.create_task(poller.poll_loop(self), name="durably-poller"),
                    asyncio.create_task(poller.lease_loop(self), name="durably-leases"),
                ]
            self._opened = True
        routing.warn_unserved(self)  # boot-time warning, never raises

    async def _take_instance(self) -> None:
        """A restart with the same instance_id: once the previous incarnation is provably
        gone (the store's instance hold), its leases are void and its runs ours at once. A
        LIVE predecessor (a rolling restart) is waited for — two live processes never share
        an instance_id, which would let each renew and release the other's leases."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.instance_wait_ms / 1000.0
        while True:
            self._instance_hold = await self.store.hold_instance(self.instance_id)
            if self._instance_hold is not None:
                break
            if loop.time() >= deadline:
                raise RuntimeError(
                    f"instance_id {self.instance_id!r} is held by another live process; "
                    f"gave up after {self.instance_wait_ms}ms (give each live process "
                    "its own instance_id, or stop the other one first)"
                )
            await asyncio.sleep(0.05)
        await self.store.release_locks_of(self.instance_id)

    async def close(self) -> None:
        """Drain in-flight turns, stop the loops and close an owned store."""
        if not self._opened:
            if self._owns_store:
                await self._close_store()
            return
        await self.drain(self.drain_timeout_ms / 1000.0)
        await self.wakes.close()
        if self._instance_hold is not None:
            hold, self._instance_hold = self._instance_hold, None
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
        leftovers = [task for task in self._tasks if not task.done()]
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.gather(*leftovers, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        self._opened = False
        if self._owns_store:
            await self._close_store()

    async def _close_store(self) -> None:
        await self.store.close()

    async def drain(self, timeout: float | None = None) -> None:
        """Stop taking work, evict parked runs, wait for turns to finish (or `timeout`)."""
        await poller.drain(self, self.drain_timeout_ms / 1000.0 if timeout is None else timeout)

    async def _ensure_open(self) -> None:
        if not self._opened:
            await self.open()

    # ================================================================== registry

    def register(self, *items: Workflow[Any, Any] | Step[Any, Any]) -> None:
        for item in items:
            if isinstance(item, Workflow):
                if self._workflows is DEFAULT_REGISTRY:
                    DEFAULT_REGISTRY.add_workflow(item)
                else:
                    self._workflows.add_workflow(item)
            else:
                if self._steps is None:
                    self._steps = Registry()
                self._steps.add_step(item)

    def registration(self, name: str, version: str | None = None) -> Workflow[Any, Any] | None:
        return self._workflows.workflow(name, version)

    def registered_workflows(self) -> list[Workflow[Any, Any]]:
        return list(self._workflows.workflows.values())

    async def unserved_on_error_routes(self) -> list[dict[str, Any]]:
        """The onError routes `{workflow, route}` whose handler is not registered here."""
        return routing.unserved_on_error_routes(self)

    def registry_step(self, name: str) -> Step[Any, Any] | None:
        if self._steps is not None:
            found = self._steps.step(name)
            if found is not None:
                return found
        return DEFAULT_REGISTRY.step(name)

    def _resolve(
        self, workflow: Workflow[Any, Any] | str, version: str | None
    ) -> Workflow[Any, Any]:
        name = workflow.name if isinstance(workflow, Workflow) else str(workflow)
        if isinstance(workflow, Workflow) and version is None:
            version = workflow.version
            if self.registration(name, version) is None:
                self.register(workflow)
        found = self.registration(name, version)
        if found is not None:
            return found
        versions = self._workflows.versions_of(name)
        if version is not None:
            raise WorkflowNotFoundError(
                f"workflow {name}@{version} is not registered — a pinned start never falls "
                f"back to another version (registered: {', '.join(versions) or 'none'})"
            )
        raise WorkflowNotFoundError(f"workflow {name} is not registered")

    # ================================================================== starting runs

    def prepare_input(self, workflow: Workflow[Any, Any], input: Any) -> JSONValue:
        """Validate a start input against the workflow's annotation/validator → JSON."""
        return validated_input(workflow, input)

    async def start(
        self,
        workflow: Workflow[I, O] | str,
        input: Any = None,
        *,
        run_id: str | None = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        priority: int | None = None,
        version: str | None = None,
        namespace: str | None = None,
    ) -> RunHandle[O]:
        """Enqueue a run and return at once. Idempotent by `run_id`."""
        unsupported.refuse_priority(priority, "Engine.start")
        given_run_id(run_id)  # a bad id is refused before the store is even opened
        await self._ensure_open()
        wf = self._resolve(workflow, version)
        json_input = self.prepare_input(wf, input)
        rid = await self.create_run(
            wf,
            json_input,
            run_id=run_id,
            tags=tags,
            search_attributes=search_attributes,
            priority=priority,
            namespace=namespace,
        )
        return RunHandle(self, rid, wf)

    async def create_run(
        self,
        wf: Workflow[Any, Any],
        json_input: JSONValue,
        *,
        run_id: str | None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        priority: int | None = None,
        namespace: str | None = None,
    ) -> str:
        return await self._plane.create_run(
            wf.name,
            wf.version,
            json_input,
            run_id=run_id,
            tags=[*wf.tags, *(tags or ())],
            search_attributes=search_attributes,
            priority=priority,
            namespace=namespace,
        )

    async def start_raw(
        self,
        workflow: str,
        json_input: JSONValue,
        run_id: str,
        *,
        version: str | None = None,
        namespace: str | None = None,
        tags: Sequence[str] | None = None,
        priority: int | None = None,
    ) -> str:
        unsupported.refuse_priority(priority, "Engine.start_raw")
        wf = self._resolve(workflow, version)
        return await self.create_run(
            wf,
            self.prepare_input(wf, json_input),
            run_id=run_id,
            tags=tags,
            namespace=namespace,
            priority=priority,
        )

    async def execute(
        self,
        workflow: Workflow[I, O] | str,
        input: Any = None,
        *,
        timeout: float | None = None,
        **options: Any,
    ) -> O:
        """Start and wait for the output; `RunFailedError` if the run does not complete."""
        handle: RunHandle[O] = await self.start(workflow, input, **options)
        return await handle.result(timeout=timeout)

    def handle(self, run_id: str) -> RunHandle[Any]:
        return RunHandle(self, run_id)

    def start_child_soon(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        child_id: str,
        parent: WorkflowRun,
        version: str | None,
        priority: int | None,
    ) -> None:
        """Start a child run after the current turn; a failed start fails the awaiting
        parent (delivered as a failed child completion)."""

        async def start_child() -> None:
            name = workflow.name if isinstance(workflow, Workflow) else workflow
            try:
                wf = self._resolve(workflow, version)
                await self.create_run(
                    wf,
                    self.prepare_input(wf, input),
                    run_id=child_id,
                    tags=[parent_tag(parent.id)],
                    namespace=parent.namespace,
                    priority=priority,
                )
            except Exception as exc:
                self.notify_parent(
                    child_id,
                    {"ok": False, "error": f'child workflow "{name}" failed to start: {exc}'},
                )

        self.spawn(start_child())

    # ================================================================== dispatch

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a coroutine in the background, tracked so it is not garbage-collected."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("durably background task failed", exc_info=task.exception())

    def dispatch(
        self, run_id: str, *, nudge: bool = False, claimed: WorkflowRun | None = None
    ) -> None:
        """The default dispatcher: a deferred `run_one` on this instance.

        With `nudge`, a run whose lease another process holds gets its wakeAt set to now.
        `claimed` is a run this instance already leased (batch pick-up): it is driven as is.
        """
        if not self.drive_runs or self.draining:
            if claimed is not None:
                self.spawn(self.store.release_run_lock(run_id))
            return
        if claimed is not None:
            self._claimed[run_id] = claimed
        if run_id in self.dispatching:
            # A turn of this run is being dispatched here: run one more turn after it.
            self._again.add(run_id)
            return
        self.dispatching.add(run_id)
        self._idle.clear()

        async def go() -> None:
            try:
                while True:
                    self._again.discard(run_id)
                    leased = self._claimed.pop(run_id, None)
                    if leased is not None:
                        acquired = True
                        await driver.drive(self, leased)
                    else:
                        acquired = await driver.run_one(self, run_id)
                    if nudge and not acquired:
                        await self.nudge(run_id)
                    if run_id not in self._again or self.draining:
                        break
            finally:
                self._again.discard(run_id)
                self.dispatching.discard(run_id)
                self.turn_finished()
                if self.pending_backlog:
                    self.wakes.kick()  # room for more of the pending backlog

        self.spawn(go())

    def turn_finished(self) -> None:
        if not self.executions and not self.dispatching:
            self._idle.set()

    def fallback_wake_at(self) -> int | None:
        """The reconcile safety-net wake for event-waiting suspends (signal, event, child,
        handoff): a lost wake is re-driven by the timer poller. None when disabled."""
        return self.clock() + self.reconcile_ms if self.reconcile_ms > 0 else None

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The engine's own thread pool for sync user code (never the loop's default)."""
        if self._executor is None:
            raise RuntimeError("the engine is not open")
        return self._executor

    # ================================================================== signals & events

    # `signal(token, payload, *, buffer=True)` and `update(...)`: signal_api.SignalApi.

    async def deliver(self, waiter: SignalWaiter, payload: JSONValue) -> None:
        await signals.deliver(self, waiter, payload)

    async def redrive(self, run_id: str, cp: StepCheckpoint | None = None) -> None:
        await signals.redrive(self, run_id, cp)

    async def nudge(self, run_id: str) -> None:
        await signals.nudge(self, run_id)

    def notify_parent(self, run: WorkflowRun | str, completion: dict[str, Any]) -> None:
        signals.notify_parent(self, run, completion)

    async def publish_event(
        self, name: str, payload: Any = None, *, id: str | None = None, buffer: bool = True
    ) -> int:
        """Signal matching waiters, start `on_event` workflows, else buffer.
        Returns the number of runs touched."""
        await self._ensure_open()
        return await publish.publish_event(self, name, payload, id=id, buffer=buffer)

    def latest_workflows(self) -> list[Workflow[Any, Any]]:
        return list(self._workflows.latest.values())

    def register_update_validator(
        self, workflow: Workflow[Any, Any] | str, name: str, fn: Callable[[Any], Any]
    ) -> None:
        wf_name = workflow.name if isinstance(workflow, Workflow) else workflow
        self._update_validators[(wf_name, name)] = fn

    # ================================================================== reading

    async def wait_for_run(
        self, run_id: str, timeout: float | None = None, until: WaitUntil = "settled"
    ) -> WorkflowRun:
        """Resolve when the run is settled (or terminal)."""
        await self._ensure_open()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        changed = _RunWatch()
        self._watchers.setdefault(run_id, set()).add(changed)
        try:
            run: WorkflowRun | None = None
            while True:
                changed.clear()
                completion = changed.completion
                if run is not None and completion is not None:
                    # This instance completed the run: its event carries the output, so
                    # no store read is needed to return the final state.
                    return replace(run, status="completed", output=completion.output, error=None)
                run = await self.store.get_run(run_id)
                if run is None:
                    raise RunNotFoundError(f"run {run_id} not found")
                if is_settled(run, until):
                    return run
                # Runs driven here announce changes through events, runs driven elsewhere
                # through the wake bus when the store has one; polling is the fallback.
                if run_id in self.executions:
                    poll = 5.0
                else:
                    poll = 1.0 if self.wakes.active else 0.25
                if deadline is not None:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise TimeoutError(
                            f"waitForRun({run_id}) timed out after {int(timeout * 1000)}ms"  # type: ignore[operator]
                        )
                    poll = min(poll, remaining)
                try:
                    await asyncio.wait_for(changed.wait(), poll)
                except TimeoutError:
                    pass
        finally:
            watchers = self._watchers.get(run_id)
            if watchers is not None:
                watchers.discard(changed)
                if not watchers:
                    del self._watchers[run_id]

    def wake_watchers(self, run_id: str) -> None:
        """Make every `wait_for_run` of this run re-read the store."""
        for changed in self._watchers.get(run_id, ()):
            changed.set()

    def _wake_watchers(self, event: EngineEvent) -> None:
        # run.started never settles a run: waking on it would only cost a store read.
        if event.type.startswith("run.") and event.type != "run.started":
            for changed in self._watchers.get(event.run_id, ()):
                if event.type == "run.completed":
                    changed.completion = event
                changed.set()

    # ================================================================== observing

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Receive every EngineEvent; returns the unsubscribe function."""
        return self.events.subscribe(listener)

    def metrics(self) -> MetricsSnapshot:
        return self.events.snapshot()

    def on_dead(self, listener: Callable[[WorkflowRun], Any]) -> Callable[[], None]:
        self._dead_listeners.append(listener)
        return lambda: self._dead_listeners.remove(listener)

    def on_cancel(self, listener: Callable[[str], Any]) -> Callable[[], None]:
        self._cancel_listeners.append(listener)
        return lambda: self._cancel_listeners.remove(listener)

    def fire_dead(self, run: WorkflowRun) -> None:
        for listener in tuple(self._dead_listeners):
            try:
                listener(run)
            except Exception:
                log.exception("on_dead listener failed")

    def fire_cancel(self, run_id: str) -> None:
        for listener in tuple(self._cancel_listeners):
            try:
                listener(run_id)
            except Exception:
                log.exception("on_cancel listener failed")

    # ================================================================== operator actions

    # cancel, requeue, retry_with_input, continue_run, delete_run: the engine's client.

    async def cancel(self, run_id: str, *, compensate: bool = False) -> RunResult | None:
        return await self._client.cancel(run_id, compensate=compensate)

    async def requeue(self, run_id: str) -> RunResult | None:
        return await self._client.retry(run_id)

    async def retry_with_input(
        self, run_id: str, input: Any, *, new_run_id: str | None = None
    ) -> str | None:
        return await self._client.retry_with_input(run_id, input, new_run_id=new_run_id)

    async def continue_run(self, run_id: str) -> RunResult | None:
        return await self._client.continue_run(run_id)

    async def redispatch_pending(self, run_id: str) -> dict[str, Any] | None:
        await self._ensure_open()
        return await operator.redispatch_pending(self._plane, run_id)

    async def delete_run(self, run_id: str) -> int:
        return await self._client.delete_run(run_id)

    async def resume(self, run_id: str) -> None:
        """Explicit re-drive of a run on this instance."""
        run = await self.store.get_run(run_id)
        if run is None:
            raise RunNotFoundError(f"run {run_id} not found")
        await driver.run_one(self, run_id)

    # ================================================================== polling (tests/ops)

    async def run_pending(self) -> int:
        return await poller.run_pending(self)

    async def recover_incomplete(self) -> int:
        return await poller.recover_incomplete(self)

    async def resume_due_timers(self) -> int:
        return await poller.resume_due_timers(self)

    async def sweep_timeouts(self) -> int:
        return await poller.sweep_timeouts(self)

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until no turn is executing or dispatched on this instance (tests)."""
        await asyncio.wait_for(self._idle.wait(), timeout)


class _RunWatch(asyncio.Event):
    """Set on every run.* event of one run; remembers a local run.completed event."""

    def __init__(self) -> None:
        super().__init__()
        self.completion: EngineEvent | None = None
