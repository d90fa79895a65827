"""The control plane's side of the tenant gateway: start-run messages, run requests from
store-less tenants, and the engine events republished to each tenant.

A tenant (a process without the store: durable-worker's `Worker.start_run`, or
`durably.TenantGateway`) reaches the control plane only through the transport. The `Gateway`
is the security boundary between tenants, so every rule below holds whatever a tenant sends:

- A start-run message starts the workflow by name in the namespace named by the tenant,
  idempotent by its run id (a redelivered message finds its run). A message that can never be
  used (malformed, too large, text a store cannot hold, an input the workflow refuses, a run id
  held by another workflow or another namespace, values the store refuses as data) is logged
  with its ids and dropped; a failure to reach the store is raised to the transport, which
  retries it and acknowledges the message only once the run exists.
- A run request is answered with exactly one reply. `listRuns`, `runFacets` and
  `runValueFacets` only ever see the tenant's namespace (the namespace the request names is
  discarded; a value facet's options are bounded like a list), `workerHealth` only
  the groups serving the tenant (`…@<tenant>`), `waitingFor` only the tenant's runs. Every
  verb on one run loads the run first and refuses one of another tenant's namespace with the
  `cross-tenant` code without calling the verb. A verb's own failure is answered with its
  message when it is one of durably's errors (they are written for the caller) and with a
  plain "internal error" otherwise (a database error may name hosts and tables that are no
  tenant's business; the full error is logged here with the request id).
- Events of runs outside the default namespace are republished to their namespace's tenant
  channel, best effort (a slow broker drops events beyond `event_backlog`, never blocks runs).

With `GatewaySettings.secret`, the tenant is taken from a signed token instead of the claim
(see `gateway_wire`), so a tenant cannot name another.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from durably._core.bounds import PayloadRejectedError
from durably._core.errors import (
    DurablyError,
    InputValidationError,
    InvalidRunIdError,
    RunIdConflictError,
    SerializationError,
    WorkflowNotFoundError,
)
from durably._core.log_context import durably_logger
from durably._core.models import RunResult, WorkflowRun
from durably._core.run_facets import RUN_VALUE_FACET_SCAN
from durably._engine.client.client import Client, HostedClient
from durably._engine.client.handle import RunWatchers
from durably._engine.control import operator
from durably._engine.control.plane import ControlPlane
from durably._engine.defs.events import EngineEvent, Listener
from durably._engine.gateway.args import (
    opt_bool,
    opt_int,
    opt_mapping,
    opt_str,
    run_id_arg,
    run_ids_arg,
    tenant_run_query,
)
from durably._engine.gateway.wire import (
    CROSS_TENANT,
    CROSS_TENANT_MESSAGE,
    RUN_ID_KINDS,
    GatewayChannel,
    GatewayMessageError,
    GatewaySettings,
    RunRequest,
    error_reply,
    ok_reply,
    parse_run_request,
    parse_start_run,
    request_id_of,
)
from durably._read import lists
from durably._read.list_models import GroupHealth, RunValueAxis, RunValueFacetOptions
from durably._read.vocabulary import FAN_PAGE_DEFAULT_LIMIT

log = durably_logger("durably.gateway")

__all__ = ["Gateway"]

# Failures of a start that no retry can cure: the message is dropped (and logged).
_UNUSABLE_START = (
    GatewayMessageError,
    InputValidationError,
    InvalidRunIdError,
    PayloadRejectedError,
    RunIdConflictError,
    SerializationError,
    WorkflowNotFoundError,
)
_TERMINAL_EVENTS = ("run.completed", "run.failed")
_NAMESPACE_MEMO = 10_000

WorkerHealth = Callable[[], Awaitable[Sequence[GroupHealth]]]
Redispatch = Callable[[str], Awaitable[dict[str, Any] | None]]
Subscribe = Callable[[Listener], Callable[[], None]]
_Verb = Callable[[RunRequest], Awaitable[Any]]


class _CrossTenant(Exception):
    pass


async def _opened() -> None:
    """The opener of a client made for a worker that is already open."""


class Gateway:
    """The tenant gateway responder of one control plane.

    - `client`: what the verbs and starts go through (in an engine, the client over its own
      control plane, so a run started here is driven here);
    - `channel`: the transport's end of the gateway (`RedisGatewayChannel`);
    - `subscribe`: the engine's event subscription (`Engine.subscribe`), for republishing
      events to tenants; None republishes nothing;
    - `worker_health`, `redispatch`: the engine's verbs of those names; None answers the
      verb with an error (a bare client has neither);
    - `settings`: limits and the token secret; `clock`: epoch ms (token expiry).

    `start()` begins consuming; `close()` stops.
    """

    def __init__(
        self,
        client: Client,
        channel: GatewayChannel,
        *,
        settings: GatewaySettings | None = None,
        subscribe: Subscribe | None = None,
        worker_health: WorkerHealth | None = None,
        redispatch: Redispatch | None = None,
        clock: Callable[[], int] | None = None,
    ):
        self._client = client
        self._channel = channel
        self._settings = settings or GatewaySettings()
        self._subscribe = subscribe
        self._worker_health = worker_health
        self._redispatch = redispatch
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._verbs: dict[str, _Verb] = {
            "getRunDetail": self._get_run_detail,
            "getFanMembers": self._get_fan_members,
            "listRuns": self._list_runs,
            "runFacets": self._run_facets,
            "runValueFacets": self._run_value_facets,
            "workerHealth": self._worker_health_verb,
            "waitingFor": self._waiting_for,
            "cancel": self._cancel,
            "retry": self._retry,
            "continue": self._continue,
            "redispatch": self._redispatch_verb,
            "retryWithInput": self._retry_with_input,
        }
        self._events: asyncio.Queue[EngineEvent] | None = None
        self._publisher: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._namespaces: OrderedDict[str, str] = OrderedDict()
        self._dropped_events = 0
        self._started = False

    @classmethod
    def for_plane(
        cls,
        plane: ControlPlane,
        watchers: RunWatchers,
        channel: GatewayChannel,
        *,
        settings: GatewaySettings | None = None,
        subscribe: Subscribe | None = None,
        worker_health: WorkerHealth | None = None,
    ) -> Gateway:
        """The gateway of an engine's worker, over its control plane (already open): runs it
        starts are driven by that worker, and `redispatch` re-sends through it."""
        client = HostedClient(plane, opener=_opened, watchers=watchers, poll=lambda _run_id: 1.0)
        return cls(
            client,
            channel,
            settings=settings,
            subscribe=subscribe,
            worker_health=worker_health,
            redispatch=functools.partial(operator.redispatch_pending, plane),
            clock=plane.clock,
        )

    # ================================================================== lifecycle

    async def start(self) -> None:
        """Start consuming start-run messages and run requests, and republishing events."""
        if self._started:
            return
        self._started = True
        if self._subscribe is not None:
            self._events = asyncio.Queue(maxsize=self._settings.event_backlog)
            self._publisher = asyncio.create_task(self._republish(), name="durably-tenant-events")
            self._unsubscribe = self._subscribe(self._on_event)
        try:
            await self._channel.serve(self.handle_start_run, self.handle_run_request)
        except BaseException:
            await self.close(0.0)  # no half-started gateway: the caller may try again
            raise

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop consuming (requests in hand get `grace_s` seconds) and republishing."""
        if not self._started:
            return
        self._started = False
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        await self._channel.close(grace_s)
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await publisher

    # ================================================================== start-run messages

    async def handle_start_run(self, data: dict[str, Any], job_id: str) -> None:
        """Start the run a message asks for. Returns once it exists (or the message was
        dropped as unusable); raises when the store failed, for the transport to retry."""
        run_id = data.get("runId")
        try:
            message = parse_start_run(data, self._settings, now_ms=self._clock())
            if message.stripped_tags:
                log.warning(
                    "start-run job %s (run %s): dropped engine-reserved tags %s",
                    job_id,
                    message.run_id,
                    list(message.stripped_tags),
                )
            handle = await self._client.start(
                message.workflow,
                message.input,
                run_id=message.run_id,
                tags=message.tags,
                search_attributes=message.search_attributes,
                namespace=message.tenant,
            )
        except _UNUSABLE_START as exc:
            self._drop_start(data, job_id, run_id, exc)
            return
        except Exception as exc:
            if not _is_data_error(exc):
                raise  # the store is unreachable or failing: the transport retries
            # Decision: the store refused the message's VALUES (PostgreSQL's "invalid byte
            # sequence", "unsupported Unicode escape sequence", a number out of range): every
            # redelivery would be refused the same way, so it is dropped like a malformed
            # message instead of being retried and re-queued forever. Only a failure to
            # reach or use the store (the connection, a timeout) is retried.
            self._drop_start(data, job_id, run_id, exc)
            return
        log.debug("start-run job %s: run %s in %s", job_id, handle.run_id, message.tenant)

    def _drop_start(
        self, data: dict[str, Any], job_id: str, run_id: object, exc: BaseException
    ) -> None:
        log.warning(
            "dropped start-run job %s (tenant %.60r, workflow %.80r, run %.80r): %s",
            job_id,
            data.get("tenant"),
            data.get("workflow"),
            run_id,
            _first_line(exc),
        )

    # ================================================================== run requests

    async def handle_run_request(self, data: dict[str, Any], job_id: str) -> dict[str, Any] | None:
        """The reply to one run request; None (logged) when it has no id to reply to."""
        request_id = request_id_of(data)
        if request_id is None:
            log.warning("dropped run request job %s: no usable requestId", job_id)
            return None
        try:
            request = parse_run_request(data, self._settings, now_ms=self._clock())
        except GatewayMessageError as exc:
            log.warning("refused run request %s (job %s): %s", request_id, job_id, exc.message)
            return error_reply(request_id, exc.message, exc.code)
        try:
            if request.kind in RUN_ID_KINDS:
                await self._check_owner(request)
            return ok_reply(request_id, await self._verbs[request.kind](request))
        except _CrossTenant:
            log.warning(
                "refused %s of run %.80r to tenant %s: another tenant's run",
                request.kind,
                request.body.get("runId"),
                request.tenant,
            )
            return error_reply(request_id, CROSS_TENANT_MESSAGE, CROSS_TENANT)
        except GatewayMessageError as exc:
            return error_reply(request_id, exc.message, exc.code)
        except DurablyError as exc:
            return error_reply(request_id, str(exc))
        except Exception:
            log.exception(
                "run request %s (%s of tenant %s) failed", request_id, request.kind, request.tenant
            )
            return error_reply(
                request_id, f"internal error on the control plane (request {request_id})"
            )

    async def _check_owner(self, request: RunRequest) -> None:
        run = await self._client.get_run(run_id_arg(request.body))
        if run is not None and _namespace(run) != request.tenant:
            raise _CrossTenant

    # ------------------------------------------------------------------ the verbs

    async def _get_run_detail(self, request: RunRequest) -> Any:
        options = opt_mapping(request.body, "options")
        return await self._client.get_run_detail(
            run_id_arg(request.body),
            summarize_fans_over=opt_int(options, "summarizeFansOver"),
            if_none_match=opt_str(options, "ifNoneMatch"),
        )

    async def _get_fan_members(self, request: RunRequest) -> Any:
        group = opt_str(request.body, "group")
        if not group:
            raise GatewayMessageError("group must be a non-empty string")
        query = opt_mapping(request.body, "query")
        return await self._client.get_fan_members(
            run_id_arg(request.body),
            group,
            offset=opt_int(query, "offset") or 0,
            limit=opt_int(query, "limit", low=1, high=1000) or FAN_PAGE_DEFAULT_LIMIT,
            failed_only=opt_bool(query, "failedOnly"),
            if_none_match=opt_str(query, "ifNoneMatch"),
        )

    async def _list_runs(self, request: RunRequest) -> Any:
        query = tenant_run_query(
            request.body.get("query"), request.tenant, self._settings, paged=True
        )
        return await lists.list_run_items(self._client.store, query)

    async def _run_facets(self, request: RunRequest) -> Any:
        query = tenant_run_query(
            request.body.get("query"), request.tenant, self._settings, paged=False
        )
        return await lists.run_facets(self._client.store, query)

    async def _run_value_facets(self, request: RunRequest) -> Any:
        query = tenant_run_query(
            request.body.get("query"), request.tenant, self._settings, paged=False
        )
        axis = request.body.get("axis")
        if not isinstance(axis, str | dict):
            raise GatewayMessageError("axis must be a field name or an object")
        try:
            parsed_axis = RunValueAxis.of(axis)
        except (ValueError, KeyError, TypeError) as exc:
            raise GatewayMessageError(f"bad axis: {exc}") from None
        opts = opt_mapping(request.body, "opts")
        # Bounded like a run list: a tenant cannot ask the store for an unbounded scan.
        options = RunValueFacetOptions(
            limit=opt_int(opts, "limit", low=1, high=self._settings.max_list_limit),
            scan=opt_int(opts, "scan", low=1, high=RUN_VALUE_FACET_SCAN),
        )
        return await lists.run_value_facets(self._client.store, parsed_axis, query, options)

    async def _worker_health_verb(self, request: RunRequest) -> Any:
        if self._worker_health is None:
            raise GatewayMessageError("worker health is not available on this control plane")
        suffix = f"@{request.tenant}"
        return [g for g in await self._worker_health() if g.group.endswith(suffix)]

    async def _waiting_for(self, request: RunRequest) -> Any:
        waiting = await self._client.waiting_for(run_ids_arg(request.body, self._settings))
        kept: dict[str, Any] = {}
        for run_id, what in waiting.items():
            run = await self._client.get_run(run_id)
            if run is not None and _namespace(run) == request.tenant:
                kept[run_id] = what
        return kept

    async def _cancel(self, request: RunRequest) -> RunResult | None:
        opts = opt_mapping(request.body, "opts")
        return await self._client.cancel(
            run_id_arg(request.body), compensate=opt_bool(opts, "compensate")
        )

    async def _retry(self, request: RunRequest) -> RunResult | None:
        return await self._client.retry(run_id_arg(request.body))

    async def _continue(self, request: RunRequest) -> RunResult | None:
        return await self._client.continue_run(run_id_arg(request.body))

    async def _redispatch_verb(self, request: RunRequest) -> Any:
        if self._redispatch is None:
            raise GatewayMessageError("redispatch is not available on this control plane")
        return await self._redispatch(run_id_arg(request.body))

    async def _retry_with_input(self, request: RunRequest) -> Any:
        # The new run inherits the origin's namespace (the tenant's: checked above) and gets
        # an id the engine mints, never one the tenant chose.
        new_id = await self._client.retry_with_input(
            run_id_arg(request.body), request.body.get("input")
        )
        return None if new_id is None else {"runId": new_id}

    # ================================================================== tenant events

    def _on_event(self, event: EngineEvent) -> None:
        # Called synchronously by the engine's event bus: never block or raise here.
        if self._events is None:
            return
        try:
            self._events.put_nowait(event)
        except asyncio.QueueFull:
            self._dropped_events += 1
            if self._dropped_events in (1, 100) or self._dropped_events % 10_000 == 0:
                log.warning(
                    "tenant event backlog full: %d event(s) not republished so far",
                    self._dropped_events,
                )

    async def _republish(self) -> None:
        assert self._events is not None
        while True:
            event = await self._events.get()
            try:
                namespace = await self._namespace_of(event)
                if namespace not in (None, "", "default"):
                    assert namespace is not None
                    await self._channel.publish_tenant_event(
                        namespace, {"tenant": namespace, "event": event.to_json()}
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("could not republish %s of run %s: %s", event.type, event.run_id, exc)
            finally:
                if event.type in _TERMINAL_EVENTS:
                    self._namespaces.pop(event.run_id, None)

    async def _namespace_of(self, event: EngineEvent) -> str | None:
        """The namespace of the event's run: stamped on run events, else one store read,
        remembered for the run's later events (bounded; forgotten when it settles)."""
        namespace = event.namespace or self._namespaces.get(event.run_id)
        if namespace is None:
            run = await self._client.get_run(event.run_id)
            if run is None:
                return None
            namespace = _namespace(run)
        if event.type not in _TERMINAL_EVENTS:
            self._namespaces[event.run_id] = namespace
            self._namespaces.move_to_end(event.run_id)
            while len(self._namespaces) > _NAMESPACE_MEMO:
                self._namespaces.popitem(last=False)
        return namespace


def _is_data_error(exc: BaseException) -> bool:
    """Whether a store failure is the database refusing the data itself (the DB-API's
    `DataError` family: asyncpg's `DataError` subclasses, SQLAlchemy's `DataError`,
    sqlite3's), found anywhere in the exception's chain. Told apart by class name so the
    gateway needs no driver: every DB-API driver names that family `DataError`."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(cls.__name__ == "DataError" for cls in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False


def _first_line(exc: BaseException) -> str:
    # A driver's error text carries the statement and its parameters on later lines: the
    # log keeps the reason, not a copy of the whole message.
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


def _namespace(run: WorkflowRun) -> str:
    return run.namespace or "default"


if TYPE_CHECKING:
    from durably._transport.redis_gateway import RedisGatewayChannel

    # The type checker proves here that the Redis channel fulfils the gateway's contract.
    def _is_a_gateway_channel(channel: RedisGatewayChannel) -> GatewayChannel:
        return channel
