"""`durably.Client`: start, signal, cancel, retry and read runs from any process.

A client needs only a store. It never imports workflow code: a run can be started by
`Workflow` object (its input validated against the workflow's annotation, as `Engine.start`
does) or by name with a JSON input, which the worker that executes the run checks when it
first drives it. The client writes to the store and announces what it did on the store's
wake bus (PostgreSQL LISTEN/NOTIFY; polling everywhere else); a worker does the rest.

An `Engine` is composed of a client (for these operations) and the worker runtime that
drives runs: its client is a `HostedClient` over the worker's control plane, which carries
the `LocalRuns` hooks (`durably._engine.control.plane`), so that a run it starts, signals or
cancels is also driven, woken or interrupted in-process.

A client answers its reads through `RunReads` and its signal-buffer verbs through
`BufferedSignals` (the parts hold the documentation of those methods), and reaches its store
through a `ClientSession` (`durably._engine.client.session`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from pydantic import ValidationError

from durably._core.buffered_signals import DEFAULT_LIST_LIMIT, BufferedSignalInfo
from durably._core.durations import Duration
from durably._core.errors import (
    InputValidationError,
    RunIdConflictError,
    RunNotFoundError,
    SerializationError,
    WorkflowNotFoundError,
)
from durably._core.ids import given_run_id
from durably._core.models import (
    LIVE_RUN_STATUSES,
    JSONValue,
    RunResult,
    StepCheckpoint,
    WorkflowRun,
)
from durably._core.quota import ConcurrencyQuota
from durably._core.retention import DEFAULT_BATCH_SIZE, PruneResult, RetentionPolicy
from durably._core.run_activity import ActivityBucket, ActivityWindow
from durably._core.triggers import refuse_engine_owned_start
from durably._engine.client.docs import documented_by
from durably._engine.client.handle import RunHandle, RunWatchers, WaitUntil
from durably._engine.client.reads import RunReads
from durably._engine.client.run_events import RowWatches
from durably._engine.client.run_gateway import RunEventListener
from durably._engine.client.schedules import ScheduleClient, StartsBy
from durably._engine.client.session import ClientSession, HostedSession, StoreSession
from durably._engine.client.signal_api import BufferedSignals
from durably._engine.control import fork as forking
from durably._engine.control import operator, retention, signals
from durably._engine.control.fleet_check import FleetCheck
from durably._engine.control.plane import ControlPlane
from durably._engine.control.signals import BufferBounds, buffer_policy
from durably._engine.control.start import StartRequest
from durably._engine.defs.intercept import (
    NO_INTERCEPTORS,
    ClientCallInfo,
    Interceptor,
    Interceptors,
)
from durably._engine.defs.options import UNSET, EngineOptions, Unset, merge_options
from durably._engine.defs.registry import Workflow
from durably._engine.defs.schedules import Schedule
from durably._engine.defs.stores import open_store
from durably._engine.defs.typed_io import (
    PLAIN,
    ValueCodec,
    output_type_codec,
    validation_details,
)
from durably._engine.flow.quotas import OnDuplicate
from durably._read import lists
from durably._read.list_models import (
    GroupHealth,
    RunFacetRow,
    RunListItem,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    RunWaiting,
)
from durably._read.models import FanPage, RunDetail
from durably._read.vocabulary import FAN_PAGE_DEFAULT_LIMIT
from durably._store.codec import Codec, wrap_store

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from durably._store.protocol import StateStore

__all__ = ["Client", "HostedClient", "output_codec", "prepare_input", "workflow_name"]

I = TypeVar("I")
O = TypeVar("O")
T = TypeVar("T")


def prepare_input(workflow: Workflow[Any, Any], input: Any) -> JSONValue:
    """Validate a start input against the workflow's annotation and validator → its JSON
    form; `InputValidationError` naming the workflow and what is wrong."""
    try:
        typed = workflow.input_codec.validate(input)
    except ValidationError as exc:
        raise InputValidationError(
            workflow.name, str(exc).replace("\n", "; "), validation_details(exc)
        ) from None
    try:
        json_input = workflow.input_codec.to_json(typed)
    except SerializationError as exc:
        raise InputValidationError(workflow.name, str(exc)) from None
    if workflow.validate_input is not None:
        verdict = workflow.validate_input(typed)
        if isinstance(verdict, str) and verdict:
            raise InputValidationError(workflow.name, verdict)
    return json_input


def workflow_name(workflow: Workflow[Any, Any] | str) -> str:
    """The name a start names its workflow by: a `Workflow`'s, or a non-empty string
    (`TypeError` for anything else)."""
    if isinstance(workflow, Workflow):
        return workflow.name
    if not isinstance(workflow, str) or not workflow:
        raise TypeError(f"workflow must be a Workflow or its name, not {workflow!r}")
    return workflow


def output_codec(workflow: Workflow[Any, Any] | str, output_type: Any) -> ValueCodec | None:
    """The codec a start's `output_type=` asks for (None when not given); a `TypeError` when
    given with a `Workflow` object, whose return annotation already says its output type."""
    if output_type is None:
        return None
    if isinstance(workflow, Workflow):
        raise TypeError(
            f"output_type= is for starts by name; the Workflow {workflow.name!r} already "
            "decodes its output with its return annotation"
        )
    return output_type_codec(output_type)


def plain_input(name: str, input: Any) -> JSONValue:
    """The input of a start by name: it must already be JSON (no annotation to apply)."""
    try:
        json_input: JSONValue = PLAIN.to_json(input)
    except SerializationError as exc:
        raise InputValidationError(name, str(exc)) from None
    return json_input


# The most runs one `cancel_where` call cancels: one call is one bounded batch.
CANCEL_WHERE_LIMIT = 1_000


class Client:
    """Start, signal, cancel, retry and read runs; needs only a store.

    `store` is a URL (`"sqlite:///app.db"`, `"postgresql+asyncpg://…"`, `"memory"`), an
    SQLAlchemy `AsyncEngine`, or a `StateStore`; None reads `DURABLY_STORE` (else the
    embedded SQLite default), like `Engine(store=…)`. `codec` encrypts payloads at rest
    exactly as `Engine(codec=…)` does — a client and the workers it talks to must use the
    same one. `namespace` is where the runs it starts live. The `signal_buffer_*` options
    bound the signals it buffers for runs not waiting yet, and `max_payload_bytes` the size
    of a signal's payload (`PayloadTooLargeError` past it), as on `Engine`: give them as
    keywords or in `options=EngineOptions(...)` (a keyword wins); a bad value raises
    `ValueError` naming it.

    Use it as `async with Client(...) as client:`; calls made before open it lazily.
    `interceptors=[...]` (`durably.Interceptor` instances) run around its calls that change
    runs (start, signal, cancel, …), outermost first.

    Its verbs are `Engine`'s under the same names and signatures; what an engine has beyond
    them needs the worker: `update` (the engine's validators check it), `publish_event`
    (its `on_event` workflows are in the engine's registry), the workers its transports
    report, queues, every event of the engine, the registry and polling by hand.
    `client.schedules` manages the schedules kept in the store (create, pause, trigger,
    backfill, delete; a `durably.ScheduleClient`), which the driving engines fire.
    `durably.SyncClient` has the same verbs for synchronous code. A client, an engine and a
    `TenantGateway` are each a `durably.RunGateway` (the surface a web tier needs).
    """

    def __init__(
        self,
        store: StateStore | AsyncEngine | str | None = None,
        *,
        codec: Codec | None = None,
        namespace: str | None = "default",
        options: EngineOptions | None = None,
        # The options that apply to a client, as on `Engine` (documented on
        # `EngineOptions`); a keyword given here overrides the same field of `options`.
        signal_buffer_ttl: Duration | Unset = UNSET,
        signal_buffer_per_token: int | Unset = UNSET,
        signal_buffer_per_namespace: int | Unset = UNSET,
        max_payload_bytes: int | Unset = UNSET,
        interceptors: Sequence[Interceptor] | None = None,
    ):
        chain = Interceptors.of(interceptors, "Client")
        # A client only sends and buffers signals, so of `options` it uses the signal-buffer
        # bounds and `max_payload_bytes` (the largest signal payload) and ignores the rest
        # (they tune the worker runtime, which a client does not run); taking the whole
        # value lets a web tier share one EngineOptions with its workers.
        settings = merge_options(
            "Client",
            options,
            {
                "signal_buffer_ttl": signal_buffer_ttl,
                "signal_buffer_per_token": signal_buffer_per_token,
                "signal_buffer_per_namespace": signal_buffer_per_namespace,
                "max_payload_bytes": max_payload_bytes,
            },
        )
        policy = buffer_policy(settings)
        opened, owns = open_store(store)
        # Worker health reads run leases: the workers' lease length (the same
        # `EngineOptions` a web tier shares with them) says when one lapsed.
        self._compose(
            settings.lease_ms,
            StoreSession(
                wrap_store(opened, codec),
                owns_store=owns,
                namespace=namespace,
                clock=lambda: int(time.time() * 1000),
                policy=policy,
            ),
            chain,
        )

    def _compose(
        self, lease_ms: int, session: ClientSession, interceptors: Interceptors = NO_INTERCEPTORS
    ) -> None:
        """Assemble the client over `session` (every constructor ends here)."""
        self._interceptors = interceptors  # around the verbs that change runs
        self._lease_ms = lease_ms
        self._session = session
        self._plane = session.plane
        self.store = session.plane.store  # what it reads and writes (wrapped by its codec)
        self._store = self.store
        self._reads = RunReads(self.store)
        self._fleet = FleetCheck(self.store)
        self._buffered = BufferedSignals(self.store, opener=session.open)
        self._watches = RowWatches(self.store)
        self.schedules = ScheduleClient(
            self.store,
            starts=StartsBy(start=self._start_schedule_run, check=self._check_schedule_workflow),
            clock=self._plane.clock,
            namespace=self._plane.namespace,
            opener=session.open,
        )
        """Persisted schedules: create, change, pause, trigger, backfill and delete them
        (`durably._engine.client.schedules.ScheduleClient`)."""

    async def _start_schedule_run(
        self, schedule: Schedule, run_id: str, namespace: str
    ) -> RunHandle[Any]:
        return await self.start(
            schedule.workflow_name,
            schedule.input,
            run_id=run_id,
            tags=list(schedule.tags) or None,
            search_attributes=schedule.search_attributes,
            namespace=namespace,
        )

    async def _check_schedule_workflow(self, name: str, namespace: str) -> None:
        # Known here (an engine's registry): served. Else the live fleet decides; with no
        # worker beating the schedule is accepted (workers may start later).
        if self._plane.registration(name, None) is not None:
            return
        await self._fleet.check(name, None, namespace)

    @property
    def namespace(self) -> str | None:
        return self._plane.namespace

    @property
    def signal_buffer(self) -> BufferBounds:
        """The bounds its signals are checked against (`max_payload_bytes`, …), as
        `Engine.signal_buffer`: what a console over this client refuses a body past."""
        return self._plane.signal_buffer

    # ================================================================== lifecycle

    async def __aenter__(self) -> Client:
        await self._session.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop listening to the wake bus and close the store if this client opened it.
        (A client an `Engine` is composed of is closed with the engine.) Its run
        subscriptions end."""
        await self._watches.close()
        await self._session.close()

    def topology(self) -> dict[str, str]:
        """Where this client reaches runs: `{"role": "control-plane"}` — the store itself
        (a `TenantGateway` answers `{"role": "tenant", "tenant": …}`). No I/O."""
        return {"role": "control-plane"}

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
        """Create a `pending` run and return its handle at once; idempotent by `run_id`
        (a run of the same workflow in the same namespace is returned as it is; a run of
        another workflow, or of another namespace, under that id is `RunIdConflictError`).
        A NUL or a lone surrogate in the workflow name, a tag or a search attribute is
        refused with `PayloadRejectedError` (a `ValueError`) before anything is written.

        `dedup_id`: while a live run of the workflow (in this namespace) was started with
        the same dedup id, a start returns that run's handle (`on_duplicate="return"`) or
        raises `DuplicateRunError` (`"raise"`); once it is completed, failed, cancelled or
        dead the id is free again. `concurrency=durably.ConcurrencyQuota(key, limit)`: this
        start's quota (instead of the workflow's), `ConcurrencyLimitError` when `limit`
        runs of the key are in flight. Both are checked with the insert in one store
        transaction, so concurrent starts in several processes cannot both pass.

        With a `Workflow` object the input is validated against its annotation and
        validator (`InputValidationError`) and the run is pinned to its version. With a
        name the input must be JSON; the worker that executes the run validates it (an
        invalid input fails the run with the validation error) and, without `version`,
        runs its newest registered version of the workflow. `output_type=T` (by name only:
        a `Workflow` carries its own) makes the handle a `RunHandle[T]` whose `result()`
        validates the stored output as a `T` (`SerializationError` when it is not one).

        A start by name is checked against the fleet (`durably._engine.control.fleet_check`):
        when workers of the namespace beat in the store and none serves the name (or the
        pinned `version`), `WorkflowNotFoundError` names the close names they serve and no
        run is written. When no worker beats at all the run is created: workers may start
        later.

        `priority`: pending runs are picked up higher first, then oldest (None counts as 0);
        the run's children, fan members, retries and continuations carry it too.
        """
        # The request is checked as it is built: a bad option is refused before the store
        # is even opened.
        request = StartRequest(
            workflow=workflow_name(workflow),
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
        info = ClientCallInfo("start", self.namespace, run_id, request.workflow)
        codec = output_codec(workflow, output_type)
        return await self._interceptors.client(
            info, lambda: self._start(workflow, input, request, output=codec)
        )

    async def _start(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        request: StartRequest,
        *,
        output: ValueCodec | None = None,
        check_fleet: bool = True,
        fresh: bool = True,
    ) -> RunHandle[Any]:
        """Create the run `request` asks for (its workflow given as an object or by name).
        A name typed by the caller is checked against the fleet (`check_fleet`); a name read
        from a stored run (a retry) is not: that run's workflow was served once."""
        refuse_engine_owned_start(workflow, request.run_id)
        await self._session.open()
        version = request.version
        if isinstance(workflow, Workflow):
            if version is not None and version != workflow.version:
                raise WorkflowNotFoundError(
                    f"start of {workflow.name}@{workflow.version} with version={version!r}: "
                    "pass the Workflow object of that version, or start it by name"
                )
            wf: Workflow[Any, Any] | None = workflow
        else:
            wf = self._plane.registration(workflow, version)
        if wf is not None:
            rid = await self._plane.create_run(
                request, prepare_input(wf, input), registered=wf, fresh=fresh
            )
            return RunHandle(self, rid, wf, self._plane.registration)
        json_input = plain_input(request.workflow, input)
        if check_fleet:
            await self._fleet.check(
                request.workflow, version, request.namespace or self.namespace, request.run_id
            )
        rid = await self._plane.create_run(request, json_input, fresh=fresh)
        return RunHandle(self, rid, None, self._plane.registration, output=output)

    async def execute(
        self,
        workflow: Workflow[I, O] | str,
        input: Any = None,
        *,
        timeout: float | None = None,
        **options: Any,
    ) -> O:
        """Start (`start`'s keywords) and wait for the output; `RunFailedError` if the run
        does not complete. A worker somewhere must drive the run."""
        handle: RunHandle[O] = await self.start(workflow, input, **options)
        return await handle.result(timeout=timeout)

    def get_handle(self, run_id: str) -> RunHandle[Any]:
        """A handle on an existing run (its output is returned as stored JSON)."""
        return RunHandle(self, run_id, None, self._plane.registration)

    async def result(self, run_id: str, timeout: float | None = None) -> Any:
        """Wait until the run is terminal: its output, or `RunFailedError`."""
        return await self.get_handle(run_id).result(timeout=timeout)

    # ================================================================== signals

    async def signal(
        self, token: str, payload: Any = None, *, buffer: bool = True
    ) -> RunResult | None:
        """Deliver `payload` to the run waiting on `token` and return that run's current
        state.

        No run waits on it yet: with `buffer=True` the payload is buffered (bounded by the
        `signal_buffer_*` options) and the next wait on the token receives it; returns None.
        With `buffer=False` nothing is stored; returns None.

        Raises `ReservedTokenError` for a token of the engine's own waits (use `update`,
        `continue_run`, `publish_event` for those), `SignalBufferFullError` when the buffer's
        cap for the token or its namespace is reached (nothing stored).
        """
        signals.check_external_token(token)
        if not isinstance(buffer, bool):
            raise TypeError(f"buffer must be True or False, not {buffer!r}")
        await self._session.open()
        info = ClientCallInfo("signal", self.namespace, token=token)
        return await self._interceptors.client(
            info,
            lambda: self._plane.signal(
                token, payload, want_result=True, buffer="bounded" if buffer else "none"
            ),
        )

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
        """Start the run `run_id` unless it exists, then signal `token` with `payload`.

        Decision: every call delivers its signal. Two concurrent callers with the same
        `run_id` end with ONE run (the start is idempotent by id) that receives BOTH
        payloads — the second is buffered (bounded) until the run waits on the token again.
        The signal is never dropped for want of a waiter: the run may not have reached its
        wait yet.
        """
        if not isinstance(run_id, str) or not run_id:
            raise ValueError("signal_with_start needs the run_id that makes it idempotent")
        signals.check_external_token(token)
        # Checked before the start: a payload the signal would refuse must not leave a run.
        signals.check_payload(
            f"signal payload for {token!r}", PLAIN.to_json(payload), self._plane.signal_buffer
        )
        request = StartRequest(
            workflow=workflow_name(workflow),
            run_id=run_id,
            tags=tuple(tags or ()),
            search_attributes=search_attributes,
            version=version,
            namespace=namespace,
        )

        async def call() -> RunHandle[Any]:
            handle = await self._start(workflow, input, request)
            await self.signal(token, payload, buffer=True)
            return handle

        info = ClientCallInfo("signal_with_start", self.namespace, run_id, request.workflow, token)
        return await self._interceptors.client(info, call)

    # ================================================================== operator actions

    async def cancel(self, run_id: str, *, compensate: bool = False) -> RunResult | None:
        """Cancel the run (and its children); `compensate=True` unwinds its saga first.
        None when the run is unknown; a settled run is returned untouched."""
        await self._session.open()
        return await self._interceptors.client(
            ClientCallInfo("cancel", self.namespace, run_id),
            lambda: operator.cancel(self._plane, run_id, compensate=compensate),
        )

    async def cancel_where(
        self, *, compensate: bool = False, limit: int = CANCEL_WHERE_LIMIT, **query: Any
    ) -> list[str]:
        """Cancel the runs a `list_runs` query matches (`status=`, `workflow=`, `tags=`,
        ...), at most `limit` of them (default and ceiling 1 000: run it again for more),
        each as `cancel` would. Only live runs are matched (a `statuses=` filter is narrowed
        to them): returns the ids of the runs it cancelled. A query with no filter would
        cancel every run, so it is refused (`ValueError`): say `workflow=` at least."""
        if not query:
            raise ValueError(
                "cancel_where() without a filter would cancel every run: give list_runs "
                "filters (status=, workflow=, tags=, namespace=, ...)"
            )
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit:
            raise ValueError(f"cancel_where(limit=...) must be a whole number >= 1, not {limit!r}")
        if "limit" in query or "offset" in query:
            raise ValueError("cancel_where() takes limit= as its own bound and no offset=")
        # Only live runs count against the bound: settled ones have nothing to cancel.
        live = [st for st in query.get("statuses") or LIVE_RUN_STATUSES if st in LIVE_RUN_STATUSES]
        if not live:
            return []
        query = {**query, "statuses": live}
        # As the console's list reads it (attribute filters may be mappings), so the runs
        # cancelled are the runs that list shows.
        await self._session.open()
        runs = await self.store.list_runs(
            lists.as_run_query(**query, limit=min(limit, CANCEL_WHERE_LIMIT))
        )
        cancelled: list[str] = []
        for run in runs:
            result = await self.cancel(run.id, compensate=compensate)
            if result is not None:
                cancelled.append(run.id)
        return cancelled

    async def retry(self, run_id: str) -> RunResult | None:
        """Retry a failed or dead run in place (the console's "retry"): its failed steps
        and failed children run again; None when the run is unknown."""
        await self._session.open()
        return await self._interceptors.client(
            ClientCallInfo("retry", self.namespace, run_id),
            lambda: operator.requeue(self._plane, run_id),
        )

    async def retry_with_input(
        self, run_id: str, input: Any, *, new_run_id: str | None = None
    ) -> str | None:
        """Fix-and-replay as a NEW run (`<run_id>~retry~<8 hex>` unless `new_run_id`)
        with `input`; its success is also delivered to the origin's parent. None when the
        run is unknown."""
        given_run_id(new_run_id, what="new run id")  # "" is refused, not made a random id
        await self._session.open()
        run = await self._store.get_run(run_id)
        if run is None:
            return None
        new_id = new_run_id or f"{run_id}~retry~{uuid.uuid4().hex[:8]}"
        registered = self._plane.registration(run.workflow, None)
        static = registered.tags if registered is not None else ()
        request = StartRequest(
            workflow=run.workflow,
            run_id=new_id,
            tags=tuple(operator.retry_tags(run, static)),
            priority=run.priority,  # a fix-and-replay is as urgent as the run it replaces
            namespace=run.namespace,
        )
        await self._interceptors.client(
            ClientCallInfo("retry_with_input", self.namespace, run_id, run.workflow),
            lambda: self._start(registered or run.workflow, input, request, check_fleet=False),
        )
        return new_id

    async def fork(
        self,
        run_id: str,
        *,
        from_seq: int,
        new_run_id: str | None = None,
        input: Any = UNSET,
        version: str | None = None,
    ) -> RunHandle[Any]:
        """Start a NEW run that reuses the settled run's checkpoints before `from_seq` and
        executes from there with the code deployed now (`version`: a registered version of
        the workflow, else the newest); the original is not changed.

        The rows copied are those with `seq < from_seq` that are settled (`completed` or
        `failed`); a waiting row is not copied (the fork waits again), a completed child's
        result row is (the child is not run again). `input` defaults to the original's. The
        fork is tagged `forked-from:<run_id>@<from_seq>` and `forked-from:<run_id>` (every
        fork of a run: `list_runs(tags=["forked-from:<run_id>"])`). Its id is `new_run_id`, else
        `<run_id>~fork~<from_seq>`; forking again to an existing fork of the same run and
        step returns it. Raises `RunNotFoundError` for an unknown run, `ValueError` for a
        run that is not settled (completed, failed, cancelled, dead) or a `from_seq` outside
        `0..last seq + 1`, `InputValidationError` for an input the workflow refuses,
        `RunIdConflictError` when `new_run_id` belongs to another run. Nothing is written
        before every check passed.
        """
        given_run_id(new_run_id, what="new run id")
        await self._session.open()
        run = await self._store.get_run(run_id)
        if run is None:
            raise RunNotFoundError(f"run {run_id!r} not found: nothing to fork")
        cps = await self._store.list_checkpoints(run_id)
        forking.check_forkable(run, cps, from_seq)
        new_id = new_run_id or forking.default_fork_id(run_id, from_seq)
        tag = forking.fork_tag(run_id, from_seq)
        existing = await self._store.get_run(new_id)
        if existing is not None:
            if tag in (existing.tags or ()):
                return self.get_handle(new_id)
            raise RunIdConflictError(new_id, existing.workflow, f"a fork of {run_id!r}")
        registered = self._plane.registration(run.workflow, version)
        fork_input = run.input if isinstance(input, Unset) else input
        # Checked before any row is copied: a refused input leaves nothing behind.
        if registered is not None:
            prepare_input(registered, fork_input)
        else:
            plain_input(run.workflow, fork_input)
        static = registered.tags if registered is not None else ()
        request = StartRequest(
            workflow=run.workflow,
            run_id=new_id,
            tags=forking.fork_tags(operator.retry_tags(run, static), run_id, from_seq),
            priority=run.priority,
            version=version,
            namespace=run.namespace,
        )
        # The rows go first, the run second: a worker may pick the run up the moment it
        # exists, and must find the reused steps already there (else it runs them again).
        await forking.copy_checkpoints(self._store, forking.rows_to_copy(cps, from_seq, new_id))
        return await self._start(
            registered or run.workflow, fork_input, request, check_fleet=False, fresh=False
        )

    async def continue_run(self, run_id: str) -> RunResult | None:
        """Release the run's first pending breakpoint; None when it has none."""
        await self._session.open()
        return await self._interceptors.client(
            ClientCallInfo("continue_run", self.namespace, run_id),
            lambda: operator.continue_run(self._plane, run_id),
        )

    async def redispatch_pending(self, run_id: str) -> dict[str, Any] | None:
        """Re-send every dispatched-but-unsettled step of the run (at-least-once); None
        when the run is unknown."""
        await self._session.open()
        return await operator.redispatch_pending(self._plane, run_id)

    async def delete_run(self, run_id: str) -> int:
        """Delete the run and its children; the number of runs deleted."""
        await self._session.open()
        return await self._interceptors.client(
            ClientCallInfo("delete_run", self.namespace, run_id),
            lambda: operator.delete_run(self._plane, run_id),
        )

    async def prune(
        self,
        policy: RetentionPolicy,
        *,
        dry_run: bool = False,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> PruneResult:
        """Delete the finished runs `policy` prunes now (with their checkpoints, waiters,
        attribute, tag and dedup rows), in batches of `batch_size` runs, at most
        `MAX_BATCHES_PER_POLICY` of them; `dry_run`: only count them. A finished parent
        whose child is still live is kept. The result has the count and the first ids."""
        await self._session.open()
        return await retention.prune(
            self._plane.store,
            policy,
            self._plane.clock(),
            dry_run=dry_run,
            batch_size=batch_size,
        )

    # ================================================================== waiting

    async def wait_for_run(
        self, run_id: str, timeout: float | None = None, until: WaitUntil = "settled"
    ) -> WorkflowRun:
        """Resolve when the run is settled (`until="terminal"`: completed, failed,
        cancelled or dead); `TimeoutError` after `timeout` seconds."""
        await self._session.open()
        session = self._session
        return await session.watchers.wait(
            self._store, run_id, timeout=timeout, until=until, poll=session.poll_interval
        )

    # ================================================================== reading (RunReads)

    @documented_by(RunReads.get_run)
    async def get_run(self, run_id: str) -> WorkflowRun | None:
        return await self._reads.get_run(run_id)

    @documented_by(RunReads.list_runs)
    async def list_runs(self, **query: Any) -> list[WorkflowRun]:
        return await self._reads.list_runs(**query)

    @documented_by(RunReads.list_run_items)
    async def list_run_items(self, **query: Any) -> list[RunListItem]:
        return await self._reads.list_run_items(**query)

    @documented_by(RunReads.list_checkpoints)
    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]:
        return await self._reads.list_checkpoints(run_id)

    @documented_by(RunReads.export_history)
    async def export_history(self, run_id: str) -> dict[str, Any]:
        return await self._reads.export_history(run_id)

    @documented_by(RunReads.get_run_children)
    async def get_run_children(self, run_id: str) -> list[str]:
        return await self._reads.get_run_children(run_id)

    @documented_by(RunReads.get_event)
    async def get_event(self, run_id: str, key: str) -> Any:
        return await self._reads.get_event(run_id, key)

    @documented_by(RunReads.get_run_detail)
    async def get_run_detail(
        self,
        run_id: str,
        *,
        summarize_fans_over: int | None = None,
        if_none_match: str | None = None,
    ) -> RunDetail | None:
        return await self._reads.get_run_detail(
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
        return await self._reads.get_fan_members(
            run_id,
            group,
            offset=offset,
            limit=limit,
            failed_only=failed_only,
            if_none_match=if_none_match,
        )

    @documented_by(RunReads.run_facets)
    async def run_facets(self, **query: Any) -> list[RunFacetRow]:
        return await self._reads.run_facets(**query)

    @documented_by(RunReads.run_activity)
    async def run_activity(self, window: ActivityWindow, **query: Any) -> list[ActivityBucket]:
        return await self._reads.run_activity(window, **query)

    @documented_by(RunReads.run_value_facets)
    async def run_value_facets(
        self,
        axis: RunValueAxis | Mapping[str, Any] | str,
        options: RunValueFacetOptions | Mapping[str, Any] | None = None,
        **query: Any,
    ) -> list[RunValueFacetRow]:
        return await self._reads.run_value_facets(axis, options, **query)

    @documented_by(RunReads.waiting_for)
    async def waiting_for(self, run_ids: Iterable[str]) -> dict[str, RunWaiting]:
        return await self._reads.waiting_for(run_ids)

    @documented_by(RunReads.count_runs)
    async def count_runs(self, **query: Any) -> int:
        return await self._reads.count_runs(**query)

    async def worker_health(self) -> list[GroupHealth]:
        """Worker groups and their health as the store tells them: one `runs@<namespace>`
        group per namespace (of this client's namespace; every one when it is None) with
        its backlog and the engines holding live run leases. The workers a transport
        reports (Redis heartbeats and descriptors) need an `Engine` with that transport."""
        await self._session.open()
        return await lists.worker_health(
            self.store,
            now_ms=self._plane.clock(),
            lease_ms=self._lease_ms,
            namespace=self.namespace,
        )

    # ================================================================== live events

    async def subscribe(self, run_id: str, listener: RunEventListener) -> Callable[[], None]:
        """Call `listener` with the run's events as its row shows them, re-read every
        second: a store-only client sees no engine events, so each status change becomes
        the event an engine emits for it (`run.started`, `run.suspended`, `run.blocked`,
        `run.completed`, `run.failed`); step events are not seen. Returns the unsubscribe
        function; the watch also ends when the client closes."""
        await self._session.open()
        return self._watches.watch(run_id, listener)

    # ================================================================== the signal buffer

    @documented_by(BufferedSignals.list_buffered_signals)
    async def list_buffered_signals(
        self, *, prefix: str | None = None, limit: int = DEFAULT_LIST_LIMIT, offset: int = 0
    ) -> list[BufferedSignalInfo]:
        return await self._buffered.list_buffered_signals(prefix=prefix, limit=limit, offset=offset)

    @documented_by(BufferedSignals.count_buffered_signals)
    async def count_buffered_signals(self, *, prefix: str | None = None) -> int:
        return await self._buffered.count_buffered_signals(prefix=prefix)

    @documented_by(BufferedSignals.purge_buffered_signals)
    async def purge_buffered_signals(
        self,
        *,
        token: str | None = None,
        prefix: str | None = None,
        expired_only: bool = False,
        all: bool = False,
    ) -> int:
        return await self._buffered.purge_buffered_signals(
            token=token, prefix=prefix, expired_only=expired_only, all=all
        )


class HostedClient(Client):
    """The client over a control plane something else runs: an `Engine`'s (the engine is
    this client plus its worker), or a gateway's inside an engine's worker.

    Opening it runs `opener` (the host's open); its waits are the host's `watchers`, and
    `poll` says how often a wait on a run re-reads it without a wake; `lease_ms` is the
    workers' lease length its worker health reads leases with. Closing it closes
    nothing: the host closes with itself. It has no store of its own to open, so it does not
    take `Client`'s constructor: it is assembled over its session directly.
    """

    def __init__(
        self,
        plane: ControlPlane,
        *,
        opener: Callable[[], Awaitable[None]],
        watchers: RunWatchers,
        poll: Callable[[str], float],
        lease_ms: int | None = None,
        interceptors: Interceptors = NO_INTERCEPTORS,
    ):
        self._compose(
            lease_ms if lease_ms is not None else EngineOptions().lease_ms,
            HostedSession(plane, opener=opener, watchers=watchers, poll=poll),
            interceptors,
        )
