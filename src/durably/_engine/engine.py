"""`durably.Engine`: start runs, drive them, signal them, observe them.

An engine is a client plus a worker: its `HostedClient` (over the worker's control plane)
starts, signals, cancels, retries and reads runs, and its `Worker` drives them. Every public
method of the client's kind is the client's, handed on; what only an engine does (updates
with validators, worker health, the registry, observing, polling by hand) is the worker's
or one of the engine's own parts (`Updates`, `WorkerHealth`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Never, TypeVar, overload

from durably._core.admission import Queue
from durably._core.buffered_signals import DEFAULT_LIST_LIMIT, BufferedSignalInfo
from durably._core.durations import Duration
from durably._core.errors import RunNotFoundError, WorkflowNotFoundError
from durably._core.log_context import durably_logger
from durably._core.models import RunResult, StepCheckpoint, WorkflowRun
from durably._core.quota import ConcurrencyQuota
from durably._core.retention import (
    DEFAULT_BATCH_SIZE,
    PruneResult,
    RetentionPolicy,
    check_policies,
)
from durably._core.run_activity import ActivityBucket, ActivityWindow
from durably._core.triggers import refuse_engine_owned_start
from durably._engine.client.client import (
    CANCEL_WHERE_LIMIT,
    Client,
    HostedClient,
    output_codec,
)
from durably._engine.client.deprecation import deprecated
from durably._engine.client.docs import documented_by
from durably._engine.client.handle import RunHandle, UpdateResult, WaitUntil
from durably._engine.client.reads import RunReads, WorkerHealth
from durably._engine.client.run_events import RunEventFilter
from durably._engine.client.run_gateway import RunEventListener
from durably._engine.client.schedules import ScheduleClient, StartsBy
from durably._engine.client.signal_api import BufferedSignals, Updates
from durably._engine.control.fleet_check import FleetCheck
from durably._engine.control.signals import buffer_policy
from durably._engine.control.start import StartRequest
from durably._engine.defs.concurrency import ConcurrencySpec
from durably._engine.defs.events import Listener, MetricsSnapshot
from durably._engine.defs.intercept import ClientCallInfo, Interceptor, Interceptors
from durably._engine.defs.options import OPTION_NAMES, UNSET, EngineOptions, Unset, merge_options
from durably._engine.defs.registry import (
    DEFAULT_REGISTRY,
    Registry,
    Step,
    Workflow,
    dead_letter_ref,
)
from durably._engine.defs.schedules import Schedule, check_schedules
from durably._engine.defs.stores import open_store
from durably._engine.defs.tallies import MetricSeries
from durably._engine.defs.typed_io import ValueCodec
from durably._engine.defs.unsupported import CONCURRENCY_OVER_TRANSPORT, refuse_engine_options
from durably._engine.flow.queues import AdmissionSpec, QueueReport
from durably._engine.flow.quotas import OnDuplicate
from durably._engine.flow.step_limits import step_limiter
from durably._engine.triggers.subscribers import ensure_builtins, install
from durably._engine.worker.persisted_schedules import PersistedScheduleFirer
from durably._engine.worker.retention import RetentionSweeper
from durably._engine.worker.roles import Role, resolve_role
from durably._engine.worker.schedules import ScheduleFirer, WindowFiring
from durably._engine.worker.worker import Worker
from durably._read.list_models import (
    GroupHealth,
    RunFacetRow,
    RunListItem,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    RunWaiting,
    WorkflowDirectory,
)
from durably._read.lists import LocalWorker
from durably._read.models import FanPage, RunDetail
from durably._read.vocabulary import FAN_PAGE_DEFAULT_LIMIT
from durably._store.codec import Codec, wrap_store
from durably._store.memory import InMemoryStateStore
from durably._store.protocol import StateStore
from durably._transport.admission_open import redis_admission
from durably._transport.open import TransportSpec, transport_pool

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

log = durably_logger("durably.engine")

# Read by `Engine(...)` when `instance_id=` is left out (set by `durably worker`, or by hand).
INSTANCE_ID_ENV = "DURABLY_INSTANCE_ID"

I = TypeVar("I")
O = TypeVar("O")
T = TypeVar("T")


class Engine:
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
    (`partition=`, …) raises `NotImplementedError` naming the feature, and a
    misspelt one a `TypeError` suggesting the right name. `engine.options` holds the
    result. An option left out of both is read from `DURABLY_<NAME>` when set
    (`DURABLY_LEASE_MS=5000`; see `EngineOptions`): code > environment > default.

    Instance id: `instance_id=` (else `DURABLY_INSTANCE_ID`) names this process to the store.
    Given one, a restart with the same id takes its previous life's runs back as soon as the
    store proves that life gone, and a live process holding the id is waited for
    (`instance_wait_ms`); two live processes never share one. Left out: a fresh id per process.

    Role (with a transport): `role="worker"` serves its steps and nothing else (drives no
    run, takes no step result or workflow decision), `role="control"` drives runs and takes
    results and decisions but serves no step, `role="both"` (the default; `DURABLY_ROLE` when
    set) does all of it. A contradictory combination raises `ValueError` (see
    `durably._engine.worker.roles`).

    Flow control: `queues=[durably.Queue(...)]` (or `register_queue`) declares the queues
    `ctx.step(..., queue=name)` waits on. `admission=` says where their slots are counted:
    "auto" (the default: across the fleet on a PostgreSQL store, per engine elsewhere),
    "local" (per engine), "store" (the PostgreSQL store; an error elsewhere), "redis" (the
    server and key prefix of the engine's Redis transport; an error without one), a
    "redis://…" URL (that server, prefix "durable") or a backend object.

    Schedules: `schedules=[durably.Schedule(...)]` starts a workflow once per window of an
    interval or a cron timetable, from the timer poll of every driving engine (one run per
    window, `sched:<id>:<window start ms>`, however many engines share the store).
    `engine.schedules` creates, pauses, triggers, backfills and deletes schedules at run
    time (kept in the store, fired the same way by every driving engine of the namespace)
    and lists them beside the static ones.
    Interceptors: `interceptors=[...]` (`durably.Interceptor` instances) run around each
    step attempt, each turn of a workflow body here and each client call that changes runs,
    outermost first (`durably.contrib.opentelemetry.TracingInterceptor` traces them).
    Anything else in the list is a `TypeError`.
    Dead letters: a run that crash recovery took back more than `max_recovery_attempts`
    times (default: no limit) is marked `dead`. `dead_letter_workflow=` (a workflow or its
    name) is then started once for it, as run `dlq:<runId>` with the input `{deadRunId,
    workflow, input, error}`; a workflow's own `dead_letter=` beats it.
    """

    def __init__(
        self,
        store: StateStore | AsyncEngine | str | None = None,
        transport: TransportSpec | None = None,
        *,
        workflows: Iterable[Workflow[Any, Any]] | None = None,
        steps: Iterable[Step[Any, Any]] | None = None,
        namespace: str | None = "default",
        drive: bool = True,
        role: Role | None = None,
        instance_id: str | None = None,
        clock: Callable[[], int] | None = None,
        codec: Codec | None = None,
        capabilities: Sequence[str] = (),
        tenant_token_secret: str | bytes | None = None,
        queues: Iterable[Queue] = (),
        schedules: Iterable[Schedule] = (),
        admission: AdmissionSpec = "auto",
        options: EngineOptions | None = None,
        dead_letter_workflow: Workflow[Any, Any] | str | None = None,
        interceptors: Sequence[Interceptor] | None = None,
        # The tuning options, each documented on `EngineOptions`. UNSET means "take it from
        # `options` (or the default)", so an explicit keyword always wins over `options`.
        lease_ms: int | Unset = UNSET,
        timer_poll_ms: int | Unset = UNSET,
        reconcile_ms: int | Unset = UNSET,
        remote_redispatch_ms: int | Unset | None = UNSET,
        remote_redispatch_max: int | Unset = UNSET,
        max_recovery_attempts: int | Unset | None = UNSET,
        drain_timeout_ms: int | Unset = UNSET,
        instance_wait_ms: int | Unset | None = UNSET,
        max_concurrent_runs: int | Unset = UNSET,
        claim_batch: int | Unset = UNSET,
        pending_batch: int | Unset = UNSET,
        max_resident_runs: int | Unset = UNSET,
        step_threads: int | Unset = UNSET,
        concurrency: ConcurrencySpec | Unset = UNSET,
        fan_window: int | Unset = UNSET,
        fold_fans_over: int | Unset = UNSET,
        event_scan_limit: int | Unset = UNSET,
        compensation_retries: int | Unset = UNSET,
        max_payload_bytes: int | Unset = UNSET,
        track_step_start: bool | Unset = UNSET,
        always_replay: bool | Unset = UNSET,
        signal_buffer_ttl: Duration | Unset = UNSET,
        signal_buffer_per_token: int | Unset = UNSET,
        signal_buffer_per_namespace: int | Unset = UNSET,
        retention: Sequence[RetentionPolicy] | RetentionPolicy | None = None,
        retention_sweep_ms: int | Unset = UNSET,
        retention_batch_size: int | Unset = UNSET,
        retention_max_batches: int | Unset = UNSET,
        # Anything else is refused at run time with a message naming the planned feature
        # (`partition=`, …) or the option it was probably meant to be. Typed
        # `Never` so that mypy rejects every such keyword before the code ever runs.
        **unsupported: Never,
    ):
        refuse_engine_options(unsupported, OPTION_NAMES)
        chain = self._interceptors = Interceptors.of(interceptors, "Engine")
        opts = merge_options(
            "Engine",
            options,
            {
                "lease_ms": lease_ms,
                "timer_poll_ms": timer_poll_ms,
                "reconcile_ms": reconcile_ms,
                "remote_redispatch_ms": remote_redispatch_ms,
                "remote_redispatch_max": remote_redispatch_max,
                "max_recovery_attempts": max_recovery_attempts,
                "drain_timeout_ms": drain_timeout_ms,
                "instance_wait_ms": instance_wait_ms,
                "max_concurrent_runs": max_concurrent_runs,
                "claim_batch": claim_batch,
                "pending_batch": pending_batch,
                "max_resident_runs": max_resident_runs,
                "step_threads": step_threads,
                "concurrency": concurrency,
                "fan_window": fan_window,
                "fold_fans_over": fold_fans_over,
                "event_scan_limit": event_scan_limit,
                "compensation_retries": compensation_retries,
                "max_payload_bytes": max_payload_bytes,
                "track_step_start": track_step_start,
                "always_replay": always_replay,
                "signal_buffer_ttl": signal_buffer_ttl,
                "signal_buffer_per_token": signal_buffer_per_token,
                "signal_buffer_per_namespace": signal_buffer_per_namespace,
                "retention_sweep_ms": retention_sweep_ms,
                "retention_batch_size": retention_batch_size,
                "retention_max_batches": retention_max_batches,
            },
        )
        self.options = opts
        store_, self._owns_store = open_store(store)
        self.store = wrap_store(store_, codec)  # encrypts payloads at rest (unchanged for None)
        self.namespace = namespace
        # An id given here, else `DURABLY_INSTANCE_ID`: a stable id, so a restarted process
        # takes its previous life's runs back at once. Without either, a fresh id per process
        # (two processes must never share one), whose runs wait out their leases after a crash.
        given_id = instance_id or os.environ.get(INSTANCE_ID_ENV, "").strip() or None
        self.instance_id = given_id or f"durably-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.clock: Callable[[], int] = clock or (lambda: int(time.time() * 1000))
        self.signal_buffer = buffer_policy(opts)
        transports = transport_pool(transport, instance_id=self.instance_id)
        if opts.concurrency is not None and transports is not None:
            raise NotImplementedError(f"Engine(concurrency=...): {CONCURRENCY_OVER_TRANSPORT}")
        # "redis" / "redis://…": a Redis backend acting for this engine (owner, clock).
        admission = (
            redis_admission(admission, transports, owner=self.instance_id, clock=self.clock)
            or admission
        )

        if workflows is None:
            registry = DEFAULT_REGISTRY
        else:
            registry = Registry()
            for wf in workflows:
                registry.add_workflow(wf)
        step_registry: Registry | None = None
        if steps is not None:
            step_registry = Registry()
            for st in steps:
                step_registry.add_step(st)
        # What this engine takes from the fleet's queues (roles.py); contradictions raise.
        self._role, role_given = resolve_role(
            role,
            drive=drive,
            workflows=None if workflows is None else len(registry.workflows),
            steps=None if step_registry is None else len(step_registry.steps),
            transport=transports is not None,
            memory_store=isinstance(store_, InMemoryStateStore),
        )
        # What executes runs in this process, and — over its control plane — the client
        # that starts, signals, cancels and reads them.
        self._worker = Worker(
            self.store,
            options=opts,
            namespace=namespace,
            drive_runs=drive,
            role=self._role,
            role_given=role_given,
            instance_id=self.instance_id,
            hold_instance=given_id is not None,
            clock=self.clock,
            signal_buffer=self.signal_buffer,
            workflows=registry,
            steps=step_registry,
            transports=transports,
            capabilities=capabilities,
            tenant_token_secret=tenant_token_secret,
            queues=queues,
            admission=admission,
            dead_letter_workflow=dead_letter_ref(
                "Engine(dead_letter_workflow=...)", dead_letter_workflow
            ),
            interceptors=chain,
        )
        install(self._worker)  # the event accumulators behind debounce=/batch=
        # Worker concurrency: a permit per in-process step handler (None: no limit).
        self._worker.flow.limit_steps(step_limiter(opts.concurrency))
        self._client = HostedClient(
            self._worker.plane,
            opener=self._ensure_open,
            watchers=self._worker.watchers,
            poll=self._worker.poll_interval,
            lease_ms=opts.lease_ms,
            interceptors=chain,
        )
        self._updates = Updates(self.store, opener=self._ensure_open, route=self._worker.deliveries)
        self._health = WorkerHealth(
            self.store,
            clock=self.clock,
            lease_ms=opts.lease_ms,
            namespace=namespace,
            local_worker=self._local_worker,
            directories=self._worker.worker_directories,
            workflows=self.registered_workflows,
        )
        self._worker.report_health_with(self._health.worker_health)
        # Retention: checked here (a bad policy fails at construction); swept only by a
        # driving engine, and of those only by the one holding the store's sweep.
        policies = check_policies(retention) if retention is not None else []
        self._retention = RetentionSweeper(
            self.store,
            policies,
            clock=self.clock,
            interval_ms=opts.retention_sweep_ms,
            batch_size=opts.retention_batch_size,
            max_batches=opts.retention_max_batches,
        )
        # Static schedules: checked here (duplicate ids, unknown workflows), fired from the
        # timer poll of a driving engine only.
        self._schedules = list(schedules)
        check_schedules(
            self._schedules,
            None if workflows is None else [wf.name for wf in registry.workflows.values()],
        )
        # Every schedule's firing decisions are kept in the store, so all engines share them.
        firing = WindowFiring(
            store=self.store, start=self._start_window, get_run=self.store.get_run
        )
        self._schedule_firer = ScheduleFirer(
            self._schedules,
            firing=firing,
            store=self.store,
            clock=self.clock,
            namespace=namespace,
        )
        # Persisted schedules (`engine.schedules`): every driving engine of the namespace
        # fires the due ones from the same poll, with the same window ids.
        self._persisted_firer = PersistedScheduleFirer(
            self.store, firing=firing, clock=self.clock, namespace=namespace
        )
        if self.drive_runs:
            if self._schedules:
                self._worker.poller.add_pass(self._schedule_firer.tick)
            self._worker.poller.add_pass(self._persisted_firer.tick)
        self._fleet = FleetCheck(self.store)
        self._explicit_workflows = workflows is not None
        self.schedules = ScheduleClient(
            self.store,
            starts=StartsBy(start=self._start_schedule_run, check=self._check_schedule_workflow),
            clock=self.clock,
            namespace=namespace,
            opener=self._ensure_open,
            static=self._schedules,
        )
        """Schedules at run time, beside this engine's static ones
        (`durably._engine.client.schedules.ScheduleClient`)."""
        self._opened = False
        self._open_lock: asyncio.Lock | None = None

    async def _start_window(
        self, schedule: Schedule, run_id: str, namespace: str | None
    ) -> RunHandle[Any]:
        return await self.start(
            schedule.workflow_name,
            schedule.input,
            run_id=run_id,
            tags=list(schedule.tags) or None,
            search_attributes=schedule.search_attributes,
            namespace=namespace,
        )

    async def _start_schedule_run(
        self, schedule: Schedule, run_id: str, namespace: str
    ) -> RunHandle[Any]:
        return await self._start_window(schedule, run_id, namespace)

    async def _check_schedule_workflow(self, name: str, namespace: str) -> None:
        registered = [wf.name for wf in self.registered_workflows()]
        if name in registered:
            return
        if self._explicit_workflows:
            # The engine was told what it runs (as static schedules are checked).
            raise WorkflowNotFoundError(
                f"schedule of unknown workflow {name!r} (registered: "
                f"{', '.join(sorted(registered)) or 'none'})"
            )
        await self._fleet.check(name, None, namespace)

    async def fire_schedules(self) -> list[str]:
        """Fire the due windows of this engine's schedules now — its static ones and the
        persisted ones of its namespace (the timer poll does this every `timer_poll_ms`);
        returns run ids: for a static schedule, the runs of its due windows, whichever tick
        started them; for a persisted one, the runs this call started."""
        await self._ensure_open()
        fired = await self._schedule_firer.tick(report=True)
        return fired + await self._persisted_firer.tick()

    @property
    def drive_runs(self) -> bool:
        """False for a read/control replica (`drive=False`) and for a step worker
        (`role="worker"`): it starts runs, never executes them."""
        return self._worker.drive_runs

    @property
    def role(self) -> Role:
        """What this engine takes from the fleet's queues: `"worker"` (serves steps only),
        `"control"` (drives runs, takes step results and workflow decisions, serves no step)
        or `"both"` (the default)."""
        return self._role

    @property
    def serves_steps(self) -> bool:
        """Whether this engine serves its steps' tasks from its transport (with one, every
        driving engine but a control plane does)."""
        return self._worker.serves_steps

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
            await self._worker.open()
            if self.drive_runs:
                self._retention.start()
            self._opened = True

    async def close(self) -> None:
        """Drain in-flight turns, stop the loops and close an owned store."""
        if self._opened:
            await self._retention.close()
            await self._worker.close(self.options.drain_timeout_ms / 1000.0)
            self._opened = False
        if self._owns_store:
            await self.store.close()

    async def drain(self, timeout: float | None = None) -> None:
        """Stop taking work, evict parked runs, wait for turns to finish (or `timeout`
        seconds; the engine's `drain_timeout_ms` by default)."""
        await self._worker.drain(
            self.options.drain_timeout_ms / 1000.0 if timeout is None else timeout
        )

    async def _ensure_open(self) -> None:
        if not self._opened:
            await self.open()

    # ================================================================== registry

    def register(self, *items: Workflow[Any, Any] | Step[Any, Any]) -> None:
        """Register workflows and steps with this engine (beyond `workflows=`/`steps=`)."""
        for item in items:
            self._worker.register(item)
        ensure_builtins(self._worker)

    def registration(self, name: str, version: str | None = None) -> Workflow[Any, Any] | None:
        """The workflow registered here under `name` (newest version when None)."""
        return self._worker.registration(name, version)

    def register_queue(self, queue: Queue) -> None:
        """Register a flow-control queue (`ctx.step(..., queue=queue.name)`), replacing
        the one registered under its name."""
        self._worker.flow.register(queue)

    def registered_workflows(self) -> list[Workflow[Any, Any]]:
        return self._worker.registered_workflows()

    async def unserved_on_error_routes(self) -> list[dict[str, Any]]:
        """The onError routes `{workflow, route}` whose handler is not registered here."""
        return self._worker.unserved_on_error_routes()

    # ================================================================== starting runs

    @overload
    async def start(
        self,
        workflow: Workflow[I, O],
        input: Any = None,
        *,
        run_id: str | None = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        priority: int | None = None,
        version: str | None = None,
        namespace: str | None = None,
        concurrency: ConcurrencyQuota | None = None,
        dedup_id: str | None = None,
        on_duplicate: OnDuplicate = "return",
        output_type: None = None,
    ) -> RunHandle[O]: ...

    @overload
    async def start(
        self,
        workflow: str,
        input: Any = None,
        *,
        run_id: str | None = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        priority: int | None = None,
        version: str | None = None,
        namespace: str | None = None,
        concurrency: ConcurrencyQuota | None = None,
        dedup_id: str | None = None,
        on_duplicate: OnDuplicate = "return",
        output_type: type[T],
    ) -> RunHandle[T]: ...

    @overload
    async def start(
        self,
        workflow: str,
        input: Any = None,
        *,
        run_id: str | None = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        priority: int | None = None,
        version: str | None = None,
        namespace: str | None = None,
        concurrency: ConcurrencyQuota | None = None,
        dedup_id: str | None = None,
        on_duplicate: OnDuplicate = "return",
        output_type: None = None,
    ) -> RunHandle[Any]: ...

    async def start(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any = None,
        *,
        run_id: str | None = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        priority: int | None = None,
        version: str | None = None,
        namespace: str | None = None,
        concurrency: ConcurrencyQuota | None = None,
        dedup_id: str | None = None,
        on_duplicate: OnDuplicate = "return",
        output_type: Any = None,
    ) -> RunHandle[Any]:
        """Enqueue a run and return at once. Idempotent by `run_id`. Pending runs are picked
        up by `priority` (higher first; None counts as 0), then oldest. `dedup_id`,
        `on_duplicate`, `concurrency` and `output_type` are `Client.start`'s.

        A name not registered here starts when the fleet serves it: live workflow workers
        on the transport, or a live worker's heartbeat row in the store
        (`durably._engine.control.fleet_check`); refused with the close names otherwise.
        With no worker beating (an engine that drives runs beats itself), an engine that
        registers workflows refuses a name it lacks, and one that registers none
        (`workflows=[]`) creates the run like `Client.start`."""
        # The request is checked as it is built: a bad option is refused before the store
        # is even opened.
        request = StartRequest(
            workflow=workflow.name if isinstance(workflow, Workflow) else str(workflow),
            run_id=run_id,
            tags=tuple(tags or ()),
            search_attributes=search_attributes,
            priority=priority,
            version=version,
            namespace=namespace,
            concurrency=concurrency,
            dedup_id=dedup_id,
            on_duplicate=on_duplicate,
        )
        refuse_engine_owned_start(workflow, run_id)
        output = output_codec(workflow, output_type)
        info = ClientCallInfo("start", self.namespace, run_id, request.workflow)
        return await self._interceptors.client(
            info, lambda: self._start_run(workflow, input, request, output)
        )

    async def _start_run(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        request: StartRequest,
        output: ValueCodec | None,
    ) -> RunHandle[Any]:
        version = request.version
        await self._ensure_open()
        worker = self._worker
        try:
            wf = worker.resolve(workflow, version)
        except WorkflowNotFoundError:
            # Not registered here: a workflow the fleet serves starts by name (its first
            # turn pins the version); a pinned version only when a live worker has it.
            if not isinstance(workflow, str):
                raise
            remote_id = await worker.start_served_elsewhere(input, request)
            return RunHandle(self, remote_id, output=output)
        rid = await worker.create_run(wf, worker.prepare_input(wf, input), request)
        # The registry too: a run routed to an onError handler returns the handler's output.
        return RunHandle(self, rid, wf, self._worker.registration, output=output)

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

    def get_handle(self, run_id: str) -> RunHandle[Any]:
        """A handle on an existing run (`Client.get_handle`); its output is decoded with the
        workflow's return annotation when the workflow is registered here."""
        return RunHandle(self, run_id, None, self._worker.registration)

    async def result(self, run_id: str, timeout: float | None = None) -> Any:
        """Wait until the run is terminal: its output, or `RunFailedError`."""
        return await self.get_handle(run_id).result(timeout=timeout)

    def handle(self, run_id: str) -> RunHandle[Any]:
        """Deprecated: `get_handle` (the name `Client` has always used for this verb)."""
        deprecated("Engine.handle", "get_handle")
        return self.get_handle(run_id)

    @overload
    async def signal_with_start(
        self,
        workflow: Workflow[I, O],
        input: Any = None,
        *,
        run_id: str,
        token: str,
        payload: Any = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        version: str | None = None,
        namespace: str | None = None,
    ) -> RunHandle[O]: ...

    @overload
    async def signal_with_start(
        self,
        workflow: str,
        input: Any = None,
        *,
        run_id: str,
        token: str,
        payload: Any = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        version: str | None = None,
        namespace: str | None = None,
    ) -> RunHandle[Any]: ...

    @documented_by(Client.signal_with_start)
    async def signal_with_start(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any = None,
        *,
        run_id: str,
        token: str,
        payload: Any = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
        version: str | None = None,
        namespace: str | None = None,
    ) -> RunHandle[Any]:
        # The engine's client starts the run over the worker's control plane, so the run
        # is driven here like one `start` creates.
        return await self._client.signal_with_start(
            workflow,
            input,
            run_id=run_id,
            token=token,
            payload=payload,
            tags=tags,
            search_attributes=search_attributes,
            version=version,
            namespace=namespace,
        )

    # ================================================================== signals & events

    async def signal(
        self, token: str, payload: Any = None, *, buffer: bool = True
    ) -> RunResult | None:
        """Deliver `payload` to the run waiting on `token` and return that
        run's current state (the engine's client does it: `Client.signal`)."""
        return await self._client.signal(token, payload, buffer=buffer)

    @documented_by(Updates.update)
    async def update(self, run_id: str, name: str, arg: Any = None) -> UpdateResult:
        return await self._updates.update(run_id, name, arg)

    async def publish_event(
        self, name: str, payload: Any = None, *, id: str | None = None, buffer: bool = True
    ) -> int:
        """Signal matching waiters, start `on_event` workflows (or feed their debounce and
        batch accumulators, the event stored before this returns), else buffer. Returns the
        number of runs touched. `EventKeyError` when a subscriber's accumulator key function
        fails on the payload: then nothing at all was published."""
        await self._ensure_open()
        ensure_builtins(self._worker)  # a workflow with debounce= may be registered late
        return await self._worker.publish_event(name, payload, id=id, buffer=buffer)

    def register_update_validator(
        self, workflow: Workflow[Any, Any] | str, name: str, fn: Callable[[Any], Any]
    ) -> None:
        """Check every `update(run_id, name, arg)` of this workflow's runs with `fn(arg)`
        first: an exception or a non-empty string rejects the update (nothing delivered)."""
        wf_name = workflow.name if isinstance(workflow, Workflow) else workflow
        self._updates.register_validator(wf_name, name, fn)

    # ================================================================== the signal buffer

    @documented_by(BufferedSignals.list_buffered_signals)
    async def list_buffered_signals(
        self, *, prefix: str | None = None, limit: int = DEFAULT_LIST_LIMIT, offset: int = 0
    ) -> list[BufferedSignalInfo]:
        return await self._client.list_buffered_signals(prefix=prefix, limit=limit, offset=offset)

    @documented_by(BufferedSignals.count_buffered_signals)
    async def count_buffered_signals(self, *, prefix: str | None = None) -> int:
        return await self._client.count_buffered_signals(prefix=prefix)

    @documented_by(BufferedSignals.purge_buffered_signals)
    async def purge_buffered_signals(
        self,
        *,
        token: str | None = None,
        prefix: str | None = None,
        expired_only: bool = False,
        all: bool = False,
    ) -> int:
        return await self._client.purge_buffered_signals(
            token=token, prefix=prefix, expired_only=expired_only, all=all
        )

    # ================================================================== reading

    async def wait_for_run(
        self, run_id: str, timeout: float | None = None, until: WaitUntil = "settled"
    ) -> WorkflowRun:
        """Resolve when the run is settled (`until="terminal"`: completed, failed,
        cancelled or dead); `TimeoutError` after `timeout` seconds."""
        return await self._client.wait_for_run(run_id, timeout, until)

    @documented_by(Client.topology)
    def topology(self) -> dict[str, str]:
        return self._client.topology()

    @documented_by(RunReads.get_run)
    async def get_run(self, run_id: str) -> WorkflowRun | None:
        return await self._client.get_run(run_id)

    @documented_by(RunReads.list_runs)
    async def list_runs(self, **query: Any) -> list[WorkflowRun]:
        return await self._client.list_runs(**query)

    @documented_by(RunReads.list_run_items)
    async def list_run_items(self, **query: Any) -> list[RunListItem]:
        return await self._client.list_run_items(**query)

    @documented_by(RunReads.list_checkpoints)
    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]:
        return await self._client.list_checkpoints(run_id)

    @documented_by(RunReads.export_history)
    async def export_history(self, run_id: str) -> dict[str, Any]:
        return await self._client.export_history(run_id)

    @documented_by(RunReads.get_run_children)
    async def get_run_children(self, run_id: str) -> list[str]:
        return await self._client.get_run_children(run_id)

    @documented_by(RunReads.get_event)
    async def get_event(self, run_id: str, key: str) -> Any:
        return await self._client.get_event(run_id, key)

    @documented_by(RunReads.get_run_detail)
    async def get_run_detail(
        self,
        run_id: str,
        *,
        summarize_fans_over: int | None = None,
        if_none_match: str | None = None,
    ) -> RunDetail | None:
        return await self._client.get_run_detail(
            run_id, summarize_fans_over=summarize_fans_over, if_none_match=if_none_match
        )

    @documented_by(RunReads.get_fan_members)
    async def get_fan_members(
        self,
        run_id: str,
        group: str,
        *,
        offset: int = 0,
        limit: int = FAN_PAGE_DEFAULT_LIMIT,
        failed_only: bool = False,
        if_none_match: str | None = None,
    ) -> FanPage | None:
        return await self._client.get_fan_members(
            run_id,
            group,
            offset=offset,
            limit=limit,
            failed_only=failed_only,
            if_none_match=if_none_match,
        )

    @documented_by(RunReads.run_facets)
    async def run_facets(self, **query: Any) -> list[RunFacetRow]:
        return await self._client.run_facets(**query)

    @documented_by(RunReads.run_activity)
    async def run_activity(self, window: ActivityWindow, **query: Any) -> list[ActivityBucket]:
        return await self._client.run_activity(window, **query)

    @documented_by(RunReads.run_value_facets)
    async def run_value_facets(
        self,
        axis: RunValueAxis | Mapping[str, Any] | str,
        options: RunValueFacetOptions | Mapping[str, Any] | None = None,
        **query: Any,
    ) -> list[RunValueFacetRow]:
        return await self._client.run_value_facets(axis, options, **query)

    @documented_by(RunReads.waiting_for)
    async def waiting_for(self, run_ids: Iterable[str]) -> dict[str, RunWaiting]:
        return await self._client.waiting_for(run_ids)

    @documented_by(RunReads.count_runs)
    async def count_runs(self, **query: Any) -> int:
        return await self._client.count_runs(**query)

    # ================================================================== worker health

    @documented_by(WorkerHealth.worker_health)
    async def worker_health(self) -> list[GroupHealth]:
        return await self._health.worker_health()

    @documented_by(WorkerHealth.workflow_directory)
    async def workflow_directory(self) -> WorkflowDirectory:
        return await self._health.workflow_directory()

    def _local_worker(self) -> LocalWorker | None:
        local = self._worker.local_worker()
        limiter = self._worker.flow.limiter
        if local is None or limiter is None:
            return local
        # Under Engine(concurrency=…) this engine reports its step permits: the current limit
        # (adaptive or fixed), the steps holding one, and what the adaptive limit measured.
        return dataclasses.replace(local, steps=limiter.status())

    # ================================================================== observing

    @overload
    def subscribe(self, listener: Listener) -> Callable[[], None]: ...
    @overload
    def subscribe(
        self, run_id: str, listener: RunEventListener
    ) -> Awaitable[Callable[[], None]]: ...
    def subscribe(self, *args: Any, **kwargs: Any) -> Any:
        """`subscribe(listener)`: receive every EngineEvent (synchronously, on the thread
        that emitted it); returns the unsubscribe function.

        `await subscribe(run_id, listener)` (as `Client.subscribe` and `RunGateway`): the
        events of that run only, delivered on the caller's loop in order (a coroutine
        listener is awaited); resolves to the unsubscribe function. An engine that does not
        drive runs (`drive=False`) sees no events of runs driven elsewhere: it follows the
        run's row instead, as a `Client` does."""
        if args and isinstance(args[0], str):
            return self._subscribe_run(*args, **kwargs)
        return self._subscribe_all(*args, **kwargs)

    def _subscribe_all(self, listener: Listener) -> Callable[[], None]:
        return self._worker.events.subscribe(listener)

    async def _subscribe_run(self, run_id: str, listener: RunEventListener) -> Callable[[], None]:
        if not self.drive_runs:
            return await self._client.subscribe(run_id, listener)
        return self._worker.events.subscribe(RunEventFilter(run_id, listener))

    def metrics(self) -> MetricsSnapshot:
        return self._worker.events.snapshot()

    def metric_series(self) -> MetricSeries:
        """The labelled counters (runs by workflow and outcome, steps by workflow and step,
        retries) and duration histograms since the engine started, copied now: what
        `durably.prometheus` exposes. Call it on the engine's loop."""
        return self._worker.events.series()

    async def queue_stats(self) -> list[QueueReport]:
        """The flow-control queues registered here: their slots held and places in line (on
        the admission backend: fleet-wide when it is shared), admissions in the current rate
        window, why they turn callers away now, and this engine's own admitted and denied
        counts (`durably._engine.flow.queues.QueueReport`)."""
        await self._ensure_open()
        return await self._worker.flow.stats()

    def on_dead(self, listener: Callable[[WorkflowRun], Any]) -> Callable[[], None]:
        """Call `listener(run)` when a run is dead-lettered (past `max_recovery_attempts`)."""
        return self._worker.on_dead(listener)

    def on_cancel(self, listener: Callable[[str], Any]) -> Callable[[], None]:
        """Call `listener(run_id)` when a run executing here is cancelled."""
        return self._worker.on_cancel(listener)

    # ================================================================== operator actions

    # cancel, retry, retry_with_input, fork, continue_run, redispatch_pending, delete_run: the
    # engine's client.

    @documented_by(Client.cancel)
    async def cancel(self, run_id: str, *, compensate: bool = False) -> RunResult | None:
        return await self._client.cancel(run_id, compensate=compensate)

    @documented_by(Client.cancel_where)
    async def cancel_where(
        self, *, compensate: bool = False, limit: int = CANCEL_WHERE_LIMIT, **query: Any
    ) -> list[str]:
        return await self._client.cancel_where(compensate=compensate, limit=limit, **query)

    @documented_by(Client.retry)
    async def retry(self, run_id: str) -> RunResult | None:
        return await self._client.retry(run_id)

    async def requeue(self, run_id: str) -> RunResult | None:
        """Deprecated: `retry`. The API spec lists this verb as `requeue(run_id)` ("the
        console's retry"); `Client` has always called it `retry`, as do the console and the
        CLI (`durably runs retry`), so `retry` is the one name on both and `requeue` keeps
        working here, with a `DeprecationWarning` naming `retry`."""
        deprecated("Engine.requeue", "retry")
        return await self.retry(run_id)

    @documented_by(Client.retry_with_input)
    async def retry_with_input(
        self, run_id: str, input: Any, *, new_run_id: str | None = None
    ) -> str | None:
        return await self._client.retry_with_input(run_id, input, new_run_id=new_run_id)

    @documented_by(Client.fork)
    async def fork(
        self,
        run_id: str,
        *,
        from_seq: int,
        new_run_id: str | None = None,
        input: Any = UNSET,
        version: str | None = None,
    ) -> RunHandle[Any]:
        return await self._client.fork(
            run_id, from_seq=from_seq, new_run_id=new_run_id, input=input, version=version
        )

    @documented_by(Client.continue_run)
    async def continue_run(self, run_id: str) -> RunResult | None:
        return await self._client.continue_run(run_id)

    @documented_by(Client.redispatch_pending)
    async def redispatch_pending(self, run_id: str) -> dict[str, Any] | None:
        return await self._client.redispatch_pending(run_id)

    @documented_by(Client.delete_run)
    async def delete_run(self, run_id: str) -> int:
        return await self._client.delete_run(run_id)

    @documented_by(Client.prune)
    async def prune(
        self,
        policy: RetentionPolicy,
        *,
        dry_run: bool = False,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> PruneResult:
        return await self._client.prune(policy, dry_run=dry_run, batch_size=batch_size)

    @property
    def retention(self) -> RetentionSweeper:
        """The retention sweep of `Engine(retention=[...])`: `sweep()` runs one now."""
        return self._retention

    async def resume(self, run_id: str) -> None:
        """Explicit re-drive of a run on this instance."""
        run = await self.store.get_run(run_id)
        if run is None:
            raise RunNotFoundError(f"run {run_id} not found")
        await self._worker.resume(run_id)

    # ================================================================== polling (tests/ops)

    # One pass of each of the poller's duties, for tests and operators that drive an engine
    # by hand; a driving engine runs them every `timer_poll_ms` by itself.

    async def run_pending(self) -> int:
        return await self._worker.poller.run_pending()

    async def recover_incomplete(self) -> int:
        return await self._worker.poller.recover_incomplete()

    async def resume_due_timers(self) -> int:
        return await self._worker.poller.resume_due_timers()

    async def sweep_timeouts(self) -> int:
        return await self._worker.poller.sweep_timeouts()

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until no turn is executing or dispatched on this instance (tests)."""
        await self._worker.wait_idle(timeout)
