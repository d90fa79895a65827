"""`durably.TenantGateway`: start, read and control runs from a process without the store.

A tenant process (one customer's workers, a service that must not hold database credentials)
reaches the control plane only through the transport, as the TypeScript gateway and
durable-worker's `Worker.start_run` do:

    async with TenantGateway("redis://…", tenant="acme") as gw:
        run_id = await gw.start("orders.place", {"sku": "A1"})
        detail = await gw.get_run_detail(run_id)

- `start` queues a start-run message and returns the run id without waiting for the control
  plane (the message is durable in the broker; the run appears once a control plane took it).
  It always sends a run id — one minted here when none is given — so a redelivered message
  finds the same run instead of starting a second one.
- Every other verb is a request answered by the control plane within `timeout_ms` (else
  `TimeoutError: control plane did not respond to <kind> within <ms>ms`). A refusal raises
  `TenantRequestError` with the control plane's message and code (`cross-tenant` for a run
  of another tenant). Answers come back as the same objects `durably.Client` returns.
- `subscribe(run_id, listener)` calls `listener(EngineEvent)` for the run's live events
  (best effort: pub/sub, nothing is replayed).
- It is a `durably.RunGateway`: its reads and controls have `Client`'s names and
  signatures, so a console written against the Protocol runs over either.

When the control plane requires signed tenant tokens, pass the `token` it issued
(`TenantGateway.mint_token` on the control plane's side); the tenant is read from it.

This module sits above the runtime, beside `durably.transports`: it uses the runtime's wire
shapes and opens the Redis channel only when given a URL, so `import durably` never needs the
Redis packages.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from durably._core.errors import DurablyError
from durably._core.ids import given_run_id
from durably._core.log_context import durably_logger
from durably._core.models import RunResult, WorkflowRun
from durably._engine.client.client import plain_input
from durably._engine.client.deprecation import deprecated
from durably._engine.client.run_gateway import RunEventListener
from durably._engine.control.start import check_run_text
from durably._engine.defs.events import EngineEvent
from durably._engine.gateway.wire import (
    TenantChannel,
    check_tenant,
    mint_tenant_token,
    read_tenant_token,
)
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

if TYPE_CHECKING:
    from durably._transport.redis_gateway import RedisGatewayChannel

log = durably_logger("durably.tenant")

__all__ = ["TenantGateway", "TenantRequestError"]

EventListener = RunEventListener


class TenantRequestError(DurablyError, RuntimeError):
    """The control plane refused a tenant's request: `message` and `code` as it answered
    (`cross-tenant`, `unauthorized`, `bad-request`, `too-large`, `unknown-kind`, or None)."""

    def __init__(self, kind: str, message: str, code: str | None):
        super().__init__(f"{kind}: {message}" + (f" ({code})" if code else ""))
        self.kind = kind
        self.message = message
        self.code = code


class TenantGateway:
    """A store-less client of the control plane, for one tenant (module description).

    `transport`: a Redis URL (then `prefix` and `namespace` name the control plane's key
    prefix and transport namespace, as on `RedisTransport`), or a gateway channel object.
    `tenant`: the tenant this process acts for (its runs' namespace); with `token` it may be
    left out. `timeout_ms`: how long a request waits for its reply.
    """

    def __init__(
        self,
        transport: str | TenantChannel = "redis://127.0.0.1:6379",
        *,
        tenant: str | None = None,
        token: str | None = None,
        prefix: str = "durable",
        namespace: str | None = None,
        timeout_ms: int = 10_000,
    ):
        if token is not None:
            named = read_tenant_token(token)
            if tenant is not None and tenant != named:
                raise ValueError(f"tenant {tenant!r} does not match the token's tenant {named!r}")
            tenant = named
        if tenant is None:
            raise ValueError("TenantGateway needs a tenant (or a token naming one)")
        self.tenant = check_tenant(tenant)
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 1:
            raise ValueError(f"timeout_ms must be a positive int, not {timeout_ms!r}")
        self.timeout_ms = timeout_ms
        self._token = token
        if isinstance(transport, str):
            self._channel: TenantChannel = _redis_channel(transport, prefix, namespace)
            self._owns_channel = True
        else:
            self._channel = transport
            self._owns_channel = False
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._stop_replies: Callable[[], Awaitable[None]] | None = None
        self._stop_events: Callable[[], Awaitable[None]] | None = None
        self._listeners: dict[str, list[EventListener]] = {}
        self._lock = asyncio.Lock()

    @staticmethod
    def mint_token(secret: bytes | str, tenant: str, *, ttl_s: float | None = None) -> str:
        """A signed token letting its bearer act as `tenant` on a control plane configured
        with `secret` (for `ttl_s` seconds; forever when None). Mint it on the control
        plane's side and hand it to the tenant: the secret never leaves the control plane."""
        return mint_tenant_token(secret, tenant, ttl_s=ttl_s)

    def topology(self) -> dict[str, str]:
        """`{"role": "tenant", "tenant": …}` (a store-backed `Client` answers
        `{"role": "control-plane"}`). No I/O."""
        return {"role": "tenant", "tenant": self.tenant}

    # ================================================================== lifecycle

    async def __aenter__(self) -> TenantGateway:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop listening; requests still waiting fail with a `TenantRequestError`."""
        for stop in (self._stop_replies, self._stop_events):
            if stop is not None:
                await stop()
        self._stop_replies = self._stop_events = None
        self._listeners.clear()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(TenantRequestError("close", "the gateway was closed", None))
        self._pending.clear()
        if self._owns_channel:
            await self._channel.close()

    # ================================================================== starting runs

    async def start(
        self,
        workflow: str,
        input: Any = None,
        *,
        run_id: str | None = None,
        tags: Sequence[str] | None = None,
        search_attributes: dict[str, str | int | float | bool] | None = None,
    ) -> str:
        """Ask the control plane to start `workflow` (by name, with a JSON input) in this
        tenant's namespace; the run id. Returns once the broker holds the request. A NUL or
        a lone surrogate in the name, a tag or a search attribute is refused here with
        `PayloadRejectedError`. A run id already taken (by another tenant's run, or a run of
        another workflow) is refused by the control plane, which logs it: the start does not
        happen, and reading the run answers `cross-tenant` or shows the other workflow."""
        if not isinstance(workflow, str) or not workflow:
            raise TypeError(f"workflow must be a workflow name, not {workflow!r}")
        # The control plane drops a start whose text a store cannot hold (logged there, with
        # no reply): refusing it here tells the caller instead of losing the start silently.
        check_run_text(workflow, tags, search_attributes)
        rid = given_run_id(run_id) or str(uuid.uuid4())
        message: dict[str, Any] = {
            "tenant": self.tenant,
            "workflow": workflow,
            "input": plain_input(workflow, input),
            "runId": rid,
        }
        if tags is not None:
            message["tags"] = list(tags)
        if search_attributes is not None:
            message["searchAttributes"] = dict(search_attributes)
        if self._token is not None:
            message["token"] = self._token
        await self._channel.start_run(message)
        return rid

    # ================================================================== reads

    async def get_run_detail(
        self,
        run_id: str,
        *,
        summarize_fans_over: int | None = None,
        if_none_match: str | None = None,
    ) -> RunDetail | None:
        """The run with its timeline and children (as `Client.get_run_detail`); None when
        unknown."""
        options: dict[str, Any] = {}
        if summarize_fans_over is not None:
            options["summarizeFansOver"] = summarize_fans_over
        if if_none_match is not None:
            options["ifNoneMatch"] = if_none_match
        data = await self._request("getRunDetail", runId=run_id, options=options)
        return RunDetail.from_json(data) if data is not None else None

    async def get_run(self, run_id: str) -> WorkflowRun | None:
        """The run, or None when unknown. There is no request for the bare run: it is read
        from the run's detail with the fans summarised past one member, so the reply stays
        small however wide the run is."""
        detail = await self.get_run_detail(run_id, summarize_fans_over=1)
        return detail.run if detail is not None else None

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
        query: dict[str, Any] = {"offset": offset, "failedOnly": failed_only, "limit": limit}
        if if_none_match is not None:
            query["ifNoneMatch"] = if_none_match
        data = await self._request("getFanMembers", runId=run_id, group=group, query=query)
        return FanPage.from_json(data) if data is not None else None

    async def list_runs(self, **query: Any) -> list[WorkflowRun]:
        """This tenant's runs matching the `RunQuery` keywords (`status`, `workflow`, `tags`,
        `limit`, `offset`, …; the JSON keys). The control plane bounds `limit`; a namespace
        given here is ignored there."""
        data = await self._request("listRuns", query=query)
        return [WorkflowRun.from_json(item) for item in _list(data)]

    async def list_run_items(self, **query: Any) -> list[RunListItem]:
        """`list_runs` with what each listed run waits on (the same request: the control
        plane answers list rows with their `waiting`)."""
        data = await self._request("listRuns", query=query)
        return [RunListItem.from_json(item) for item in _list(data)]

    async def run_facets(self, **query: Any) -> list[RunFacetRow]:
        data = await self._request("runFacets", query=query)
        return [RunFacetRow.from_json(item) for item in _list(data)]

    async def run_value_facets(
        self,
        axis: RunValueAxis | Mapping[str, Any] | str,
        options: RunValueFacetOptions | Mapping[str, Any] | None = None,
        **query: Any,
    ) -> list[RunValueFacetRow]:
        """The values that fill a filter picker (as `Client.run_value_facets`), over this
        tenant's runs. A bad axis or option is refused here, before any round trip."""
        args: dict[str, Any] = {"axis": RunValueAxis.of(axis).to_json(), "query": query}
        if options is not None:
            args["opts"] = RunValueFacetOptions.of(options).to_json()
        data = await self._request("runValueFacets", **args)
        return [RunValueFacetRow.from_json(item) for item in _list(data)]

    async def worker_health(self) -> list[GroupHealth]:
        """The worker groups serving this tenant (`…@<tenant>`)."""
        data = await self._request("workerHealth")
        return [GroupHealth.from_json(item) for item in _list(data)]

    async def waiting_for(self, run_ids: Iterable[str]) -> dict[str, RunWaiting]:
        data = await self._request("waitingFor", runIds=list(run_ids))
        if not isinstance(data, dict):
            return {}
        return {str(k): RunWaiting.from_json(v) for k, v in data.items()}

    # ================================================================== control

    async def cancel(self, run_id: str, *, compensate: bool = False) -> RunResult | None:
        data = await self._request("cancel", runId=run_id, opts={"compensate": compensate})
        return RunResult.from_json(data) if data is not None else None

    async def retry(self, run_id: str) -> RunResult | None:
        data = await self._request("retry", runId=run_id)
        return RunResult.from_json(data) if data is not None else None

    async def continue_run(self, run_id: str) -> RunResult | None:
        data = await self._request("continue", runId=run_id)
        return RunResult.from_json(data) if data is not None else None

    async def redispatch_pending(self, run_id: str) -> dict[str, Any] | None:
        """Re-send every dispatched-but-unsettled remote step of the run (as
        `Client.redispatch_pending`); None when the run is unknown."""
        data = await self._request("redispatch", runId=run_id)
        return data if isinstance(data, dict) else None

    async def redispatch(self, run_id: str) -> dict[str, Any] | None:
        """Deprecated name of `redispatch_pending` (the name `Client` and `Engine` use)."""
        deprecated("TenantGateway.redispatch", "redispatch_pending")
        return await self.redispatch_pending(run_id)

    async def retry_with_input(self, run_id: str, input: Any) -> str | None:
        """Fix-and-replay as a new run (its id, minted by the control plane); None when the
        run is unknown."""
        data = await self._request("retryWithInput", runId=run_id, input=input)
        return str(data["runId"]) if isinstance(data, dict) and "runId" in data else None

    # ================================================================== live events

    async def subscribe(self, run_id: str, listener: EventListener) -> Callable[[], None]:
        """Call `listener` with each live event of the run; returns the unsubscribe function."""
        async with self._lock:
            if self._stop_events is None:
                self._stop_events = await self._channel.subscribe_tenant_events(
                    self.tenant, self._on_event
                )
        self._listeners.setdefault(run_id, []).append(listener)

        def unsubscribe() -> None:
            listeners = self._listeners.get(run_id, [])
            if listener in listeners:
                listeners.remove(listener)
            if not listeners:
                self._listeners.pop(run_id, None)

        return unsubscribe

    async def _on_event(self, message: dict[str, Any]) -> None:
        raw = message.get("event")
        if message.get("tenant") != self.tenant or not isinstance(raw, dict):
            return
        listeners = self._listeners.get(str(raw.get("runId")))
        if not listeners:
            return
        try:
            event = EngineEvent.from_json(raw)
        except (ValueError, TypeError, KeyError) as exc:
            log.debug("skipped an event this version cannot read: %s", exc)
            return
        for listener in tuple(listeners):
            try:
                outcome = listener(event)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:
                log.exception("tenant event listener failed")

    # ================================================================== requests

    async def _request(self, kind: str, **args: Any) -> Any:
        async with self._lock:
            if self._stop_replies is None:
                # Subscribed before the first request leaves, so no reply can be missed.
                self._stop_replies = await self._channel.subscribe_replies(self._on_reply)
        request_id = str(uuid.uuid4())
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        request: dict[str, Any] = {
            "requestId": request_id,
            "tenant": self.tenant,
            "body": {"kind": kind, **args},
        }
        if self._token is not None:
            request["token"] = self._token
        try:
            await self._channel.send_request(request)
            reply = await asyncio.wait_for(future, self.timeout_ms / 1000)
        except TimeoutError:
            raise TimeoutError(
                f"control plane did not respond to {kind} within {self.timeout_ms}ms"
            ) from None
        finally:
            self._pending.pop(request_id, None)
        result = reply.get("result")
        if not isinstance(result, dict):
            raise TenantRequestError(kind, "the control plane sent an unreadable reply", None)
        if result.get("ok") is True:
            return result.get("data")
        error = result.get("error")
        error = error if isinstance(error, dict) else {}
        code = error.get("code")
        raise TenantRequestError(
            kind,
            str(error.get("message") or "the control plane refused the request"),
            code if isinstance(code, str) else None,
        )

    def _on_reply(self, reply: dict[str, Any]) -> None:
        # Replies to every tenant share one channel: keep only those this process awaits.
        future = self._pending.get(str(reply.get("requestId")))
        if future is not None and not future.done():
            future.set_result(reply)


def _list(data: Any) -> list[Any]:
    return data if isinstance(data, list) else []


def _redis_channel(url: str, prefix: str, namespace: str | None) -> RedisGatewayChannel:
    # Imported here, not at the top: the Redis packages are an optional extra, and
    # `import durably` must not need them.
    try:
        from durably._transport.redis_gateway import RedisGatewayChannel
    except ImportError as exc:
        raise ImportError(
            f"TenantGateway({url!r}) needs the Redis transport's packages: "
            f"pip install 'durably[redis]' ({exc})"
        ) from None
    return RedisGatewayChannel(url, prefix=prefix, namespace=namespace)


if TYPE_CHECKING:
    # The type checker proves here that the Redis channel fulfils the tenant's contract.
    def _is_a_tenant_channel(channel: RedisGatewayChannel) -> TenantChannel:
        return channel
