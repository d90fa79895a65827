"""The console's JSON API over a `Client`'s or an `Engine`'s read and control methods.

Over a `Client` (a web tier that runs no worker) every run, signal and operator route works
from the store; the panels that only a worker can answer — `updates` (an engine's
validators check them), `workers`, `workers/directory` and `queues` (what the engine's
transports and flow control report) — answer `501` saying they need an `Engine`, and
`metrics` serves the run gauges read from the store without the engine's event counters.
`metrics` is Prometheus text from `durably.prometheus` (one registry per console).

Every route is relative to the API base path. Mutating routes (retry, retry-with-input,
cancel, continue, redispatch, delete, bulk, webhooks, updates, a schedule's pause, unpause
and trigger) answer `403` in read-only mode.
Every timeline row of a run's detail and of a fan page carries `row`: what it stands for
(`durably._read.rows`: its true kind, its real duration, whether the engine wrote it).
Errors use `{statusCode, message, error}`. Query parameters are read strictly (see
`filters`): every route names the parameters it takes and refuses any other with a 400,
so a typo can never widen what a request reads or changes. Same-origin, content type and
body size are checked before any route runs (`security.ConsoleGate`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from durably._core.bounds import PayloadRejectedError, PayloadTooLargeError, loads_untrusted
from durably._core.errors import (
    InputValidationError,
    ReservedTokenError,
    RunIdConflictError,
    RunNotFoundError,
    SignalBufferFullError,
)
from durably._core.log_context import durably_logger
from durably._core.models import WorkflowRun
from durably._engine.client.client import Client
from durably._engine.defs.options import UNSET
from durably._engine.engine import Engine
from durably._observe.prometheus import CONTENT_TYPE, PrometheusMetrics
from durably._read import lists, rows
from durably._read.list_models import RunListItem
from durably._read.models import FanPage, RunDetail
from durably._read.vocabulary import FAN_PAGE_DEFAULT_LIMIT
from durably.dashboard.activity import ACTIVITY_PARAMS, activity_json
from durably.dashboard.filters import (
    FILTER_PARAMS,
    MAX_OFFSET,
    PAGE_PARAMS,
    BadRequest,
    MultiParams,
    boolean,
    check_known,
    integer,
    page,
    run_query_kwargs,
    value_facet_request,
)
from durably.dashboard.paths import path_param
from durably.dashboard.responses import error_response, json_response, not_modified
from durably.dashboard.schedules import ScheduleRoutes
from durably.dashboard.stream import sse_response

__all__ = [
    "BULK_ACTIONS",
    "BULK_LIMIT",
    "NEEDS_ENGINE_MESSAGE",
    "READ_ONLY_MESSAGE",
    "DashboardApi",
]

log = durably_logger("durably.dashboard")

#: `POST bulk/:action` considers at most this many matching runs.
BULK_LIMIT = 500
BULK_ACTIONS = ("cancel", "retry")
_LIST_PARAMS = FILTER_PARAMS | PAGE_PARAMS
#: A bulk action does not page (it applies to up to BULK_LIMIT runs): a `limit` given to
#: it would be ignored — a wider action than asked — so it is refused as unknown.
_BULK_PARAMS = FILTER_PARAMS | {"compensate", "all"}
_NONE: frozenset[str] = frozenset()
READ_ONLY_MESSAGE = (
    "This durable dashboard is read-only: {action} is disabled (the console was started "
    "with read_only=True / --read-only)."
)

Endpoint = Callable[[Request], Awaitable[Response]]


def _params(request: Request, allowed: frozenset[str] | set[str]) -> MultiParams:
    params = request.query_params
    check_known(params, allowed)
    return params


async def _json_body(request: Request, default: Any = None, *, max_bytes: int) -> Any:
    """The body as JSON read with the shared boundary checks: deeper than the nesting limit,
    `NaN`, a lone surrogate or more than `max_bytes` (the engine's `max_payload_bytes`) is
    refused here (`PayloadRejectedError`: a 400, or 413 for the size) — never a 500 from a
    `RecursionError` in the parser or a store write that cannot encode the value."""
    raw = await request.body()
    if not raw.strip():
        return default
    return loads_untrusted(raw, what="request body", max_bytes=max_bytes)


def _prefix_param(params: MultiParams) -> str | None:
    values = params.getlist("prefix")
    if len(values) > 1:
        raise BadRequest("Query parameter `prefix` is given more than once; give it once.")
    if values and not values[0]:
        raise BadRequest("Query parameter `prefix` is empty: omit it to list every token.")
    return values[0] if values else None


def _result(value: Any) -> Response:
    if value is None:
        return Response(status_code=200)
    return json_response(value.to_json() if hasattr(value, "to_json") else value)


class DashboardApi:
    """Route handlers bound to one client or engine (`worker` is the engine, None over a
    bare client: the panels that need it say so)."""

    def __init__(self, engine: Client | Engine, *, read_only: bool = False) -> None:
        self.engine = engine
        self.worker = engine if isinstance(engine, Engine) else None
        self.read_only = read_only
        self._max_bytes = engine.signal_buffer.max_payload_bytes
        self._schedules = ScheduleRoutes(engine.schedules, max_bytes=self._max_bytes)
        self._prometheus = PrometheusMetrics(engine)

    # ------------------------------------------------------------------ routing

    def routes(self, wrap: Callable[[Endpoint], Endpoint]) -> list[Route]:
        def r(path: str, endpoint: Endpoint, method: str = "GET") -> Route:
            return Route(path, wrap(self._errors(endpoint)), methods=[method])

        def w(path: str, endpoint: Endpoint, action: str, method: str = "POST") -> Route:
            return r(path, self._mutating(endpoint, action), method)

        return [
            r("/runs", self.list_runs),
            r("/runs/facets", self.run_facets),
            r("/runs/values", self.run_values),
            r("/runs/activity", self.run_activity),
            r("/runs/{run_id}", self.run_detail),
            w("/runs/{run_id}", self.delete_run, "delete", "DELETE"),
            r("/runs/{run_id}/fans/{group:path}", self.fan_members),
            r("/runs/{run_id}/stream", self.stream),
            r("/runs/{run_id}/events/{key:path}", self.get_event),
            w("/runs/{run_id}/retry", self.retry, "retry"),
            w("/runs/{run_id}/retry-with-input", self.retry_with_input, "retry with input"),
            w("/runs/{run_id}/fork", self.fork, "fork"),
            w("/runs/{run_id}/cancel", self.cancel, "cancel"),
            w("/runs/{run_id}/continue", self.continue_run, "continue"),
            w("/runs/{run_id}/redispatch", self.redispatch, "redispatch"),
            w("/runs/{run_id}/updates/{name:path}", self.update, "update"),
            w("/bulk/{action}", self.bulk, "bulk actions"),
            w("/webhooks/{token:path}", self.webhook, "signal (webhook delivery)"),
            r("/signals/buffered", self.buffered_signals),
            w("/signals/buffered/purge", self.purge_signals, "purge buffered signals"),
            r("/metrics", self.metrics),
            r("/workers", self.workers),
            r("/workers/directory", self.workflow_directory),
            r("/queues", self.queues),
            r("/topology", self.topology),
            r("/schedules", self._schedules.list),
            r("/schedules/{schedule_id}", self._schedules.describe),
            w("/schedules/{schedule_id}/pause", self._schedules.pause, "pause schedule"),
            w("/schedules/{schedule_id}/unpause", self._schedules.unpause, "unpause schedule"),
            w("/schedules/{schedule_id}/trigger", self._schedules.trigger, "trigger schedule"),
        ]

    def _errors(self, endpoint: Endpoint) -> Endpoint:
        async def guarded(request: Request) -> Response:
            try:
                return await endpoint(request)
            except BadRequest as exc:
                return error_response(400, str(exc))
            except PayloadTooLargeError as exc:
                return error_response(413, str(exc))
            except PayloadRejectedError as exc:
                # Malformed, too deep, or a value no store can hold: the sender's mistake.
                return error_response(400, str(exc))
            except ReservedTokenError as exc:
                # A token of the engine's own waits (a child's completion, a breakpoint, an
                # update, …): forging one would complete a wait that did not happen.
                return error_response(400, str(exc), {"token": exc.token, "kind": exc.kind})
            except SignalBufferFullError as exc:
                # The buffer's cap for the token or its namespace is reached; nothing was
                # stored. 429: the sender may retry once the buffer drains.
                return error_response(429, str(exc))
            except InputValidationError as exc:
                # The input a client sent does not fit the workflow: the client's mistake,
                # answered with what the validation found (not a 500).
                return error_response(422, str(exc), {"details": exc.details})
            except Exception as exc:
                log.exception("durably dashboard: %s %s failed", request.method, request.url)
                return error_response(500, f"{type(exc).__name__}: {exc}")

        return guarded

    def _mutating(self, endpoint: Endpoint, action: str) -> Endpoint:
        async def gate(request: Request) -> Response:
            if self.read_only:
                return error_response(403, READ_ONLY_MESSAGE.format(action=action))
            return await endpoint(request)

        return gate

    # ------------------------------------------------------------------ lists

    async def list_runs(self, request: Request) -> Response:
        params = _params(request, _LIST_PARAMS)
        limit, offset = page(params)
        query = lists.as_run_query(**run_query_kwargs(params), limit=limit, offset=offset)
        items = await lists.list_run_items(self.engine.store, query)
        return json_response([_list_row(item) for item in items])

    async def run_facets(self, request: Request) -> Response:
        # Whole-set counts: the page window and the status/origin predicates (the chips
        # being counted) are read, checked and left out.
        params = _params(request, _LIST_PARAMS)
        page(params)
        query = run_query_kwargs(params)
        for key in ("status", "statuses", "origin", "origins"):
            query.pop(key, None)
        rows = await self.engine.run_facets(**query)
        return json_response([row.to_json() for row in rows])

    async def run_values(self, request: Request) -> Response:
        axis, query, limit, offset = value_facet_request(request.query_params)
        rows = await self.engine.run_value_facets(axis, {"limit": limit + offset}, **query)
        return json_response([row.to_json() for row in rows[offset : offset + limit]])

    async def run_activity(self, request: Request) -> Response:
        """Runs started / completed / failed per time bucket (`activity`)."""
        params = _params(request, ACTIVITY_PARAMS)
        return json_response(await activity_json(self.engine, params, self._now_ms()))

    # ------------------------------------------------------------------ detail

    async def run_detail(self, request: Request) -> Response:
        run_id = path_param(request, "run_id")
        params = _params(request, {"summarizeFansOver"})
        over = None
        if params.getlist("summarizeFansOver"):
            over = integer(params, "summarizeFansOver", default=0, low=0, high=MAX_OFFSET)
        detail = await self.engine.get_run_detail(
            run_id,
            summarize_fans_over=over,
            if_none_match=request.headers.get("if-none-match"),
        )
        if detail is None:
            return error_response(404, f"run {run_id} not found")
        if detail.not_modified and detail.etag is not None:
            return not_modified(detail.etag)
        headers = {"ETag": detail.etag} if detail.etag else None
        return json_response(self._detail_json(detail), headers=headers)

    async def fan_members(self, request: Request) -> Response:
        run_id = path_param(request, "run_id")
        group = path_param(request, "group")
        params = _params(request, PAGE_PARAMS | {"failedOnly"})
        limit, offset = page(params, default=FAN_PAGE_DEFAULT_LIMIT)
        members = await self.engine.get_fan_members(
            run_id,
            group,
            offset=offset,
            limit=limit,
            failed_only=boolean(params, "failedOnly") or False,
            if_none_match=request.headers.get("if-none-match"),
        )
        if members is None:
            return error_response(404, f"run {run_id} not found")
        if members.not_modified and members.etag is not None:
            return not_modified(members.etag)
        headers = {"ETag": members.etag} if members.etag else None
        return json_response(self._page_json(members), headers=headers)

    def _now_ms(self) -> int:
        # The engine's clock when there is one (its rows were stamped by it), else the wall.
        return self.worker.clock() if self.worker is not None else int(time.time() * 1000)

    def _detail_json(self, detail: RunDetail) -> dict[str, Any]:
        body: dict[str, Any] = detail.to_json()
        now = self._now_ms()
        views = rows.describe_rows(detail.timeline, now)
        body["timeline"] = rows.annotate(detail.timeline, views, now)
        for fan, fan_json in zip(detail.fans or (), body.get("fans", ()), strict=True):
            if fan.failures:
                fan_json["failures"] = rows.annotate(fan.failures, None, now)
        return body

    def _page_json(self, page: FanPage) -> dict[str, Any]:
        body: dict[str, Any] = page.to_json()
        now = self._now_ms()
        body["items"] = rows.annotate(page.items, rows.describe_rows(page.items, now), now)
        return body

    async def stream(self, request: Request) -> Response:
        _params(request, _NONE)
        run_id = path_param(request, "run_id")
        if await self.engine.get_run(run_id) is None:
            return error_response(404, f"run {run_id} not found")
        return sse_response(self.engine, run_id, request)

    async def get_event(self, request: Request) -> Response:
        _params(request, _NONE)
        run_id = path_param(request, "run_id")
        value = await self.engine.get_event(run_id, path_param(request, "key"))
        return json_response(value)

    # ------------------------------------------------------------------ controls

    async def delete_run(self, request: Request) -> Response:
        """`DELETE runs/:id`: delete a finished run with its checkpoints and its child runs
        (`delete_run`); `{runId, deleted}` (how many runs went).

        Only a terminal run (completed, failed, cancelled, dead), and only when none of its
        descendants is still live: deleting a live run orphans the worker driving it (its
        next write would find no run) — cancel it first. Checked, then deleted: a descendant
        started in between is deleted with the rest, as `delete_run` does."""
        _params(request, _NONE)
        run_id = path_param(request, "run_id")
        run = await self.engine.get_run(run_id)
        if run is None:
            return error_response(404, f"run {run_id} not found")
        if not run.is_terminal:
            return error_response(
                409,
                f"run {run_id} is {run.status}: only a finished run (completed, failed, "
                "cancelled or dead) can be deleted — cancel it first.",
                {"status": run.status},
            )
        child = await self._live_descendant(run_id)
        if child is not None:
            return error_response(
                409,
                f"run {run_id} has a child run {child.id} that is still {child.status}: "
                "deleting the run would delete it too — cancel it first.",
                {"childRunId": child.id, "status": child.status},
            )
        deleted = await self.engine.delete_run(run_id)
        return json_response({"runId": run_id, "deleted": deleted})

    async def _live_descendant(self, run_id: str) -> WorkflowRun | None:
        """The first descendant of the run that is not terminal, else None."""
        seen = {run_id}
        todo = [run_id]
        while todo:
            for child_id in await self.engine.get_run_children(todo.pop()):
                if child_id in seen:
                    continue
                seen.add(child_id)
                child = await self.engine.get_run(child_id)
                if child is None:
                    continue
                if not child.is_terminal:
                    return child
                todo.append(child_id)
        return None

    async def retry(self, request: Request) -> Response:
        _params(request, _NONE)
        run_id = path_param(request, "run_id")
        result = await self.engine.retry(run_id)
        if result is None:
            return error_response(404, f"run {run_id} not found")
        return _result(result)

    async def retry_with_input(self, request: Request) -> Response:
        _params(request, _NONE)
        run_id = path_param(request, "run_id")
        body = await _json_body(request, {}, max_bytes=self._max_bytes)
        if not isinstance(body, dict):
            raise BadRequest("Body must be a JSON object `{input}`.")
        new_id = await self.engine.retry_with_input(run_id, body.get("input"))
        if new_id is None:
            return error_response(404, f"run {run_id} not found")
        return json_response({"runId": new_id})

    async def fork(self, request: Request) -> Response:
        """`{fromSeq, newRunId?, input?}` → `{runId}`: a new run reusing the run's steps
        before `fromSeq` (an absent `input` keeps the original's)."""
        _params(request, _NONE)
        run_id = path_param(request, "run_id")
        body = await _json_body(request, {}, max_bytes=self._max_bytes)
        if not isinstance(body, dict) or set(body) - {"fromSeq", "newRunId", "input"}:
            raise BadRequest("Body must be a JSON object `{fromSeq, newRunId?, input?}`.")
        from_seq = body.get("fromSeq")
        if isinstance(from_seq, bool) or not isinstance(from_seq, int):
            raise BadRequest(f"fromSeq must be an integer, not {from_seq!r}.")
        new_run_id = body.get("newRunId")
        if new_run_id is not None and not isinstance(new_run_id, str):
            raise BadRequest(f"newRunId must be a string, not {new_run_id!r}.")
        try:
            handle = await self.engine.fork(
                run_id,
                from_seq=from_seq,
                new_run_id=new_run_id,
                input=body["input"] if "input" in body else UNSET,
            )
        except RunNotFoundError as exc:
            return error_response(404, str(exc))
        except RunIdConflictError as exc:
            return error_response(409, str(exc))
        except InputValidationError:
            raise  # answered as every refused input is (422)
        except ValueError as exc:
            # A run that has not settled, or a step out of its range.
            return error_response(409, str(exc))
        return json_response({"runId": handle.run_id, "forkedFrom": run_id, "fromSeq": from_seq})

    async def cancel(self, request: Request) -> Response:
        run_id = path_param(request, "run_id")
        compensate = boolean(_params(request, {"compensate"}), "compensate") or False
        result = await self.engine.cancel(run_id, compensate=compensate)
        if result is None:
            return error_response(404, f"run {run_id} not found")
        return _result(result)

    async def continue_run(self, request: Request) -> Response:
        _params(request, _NONE)
        run_id = path_param(request, "run_id")
        result = await self.engine.continue_run(run_id)
        if result is None:
            return error_response(404, f"run {run_id} is not paused at a breakpoint")
        return _result(result)

    async def redispatch(self, request: Request) -> Response:
        _params(request, _NONE)
        run_id = path_param(request, "run_id")
        result = await self.engine.redispatch_pending(run_id)
        if result is None:
            return error_response(404, f"run {run_id} not found")
        return json_response(result)

    async def update(self, request: Request) -> Response:
        _params(request, _NONE)
        run_id = path_param(request, "run_id")
        arg = await _json_body(request, max_bytes=self._max_bytes)
        if self.worker is None:
            return _needs_engine("updates")
        outcome = await self.worker.update(run_id, path_param(request, "name"), arg)
        if not outcome.accepted:
            return json_response({"accepted": False, "reason": outcome.reason})
        run = await self.engine.get_run(run_id)
        return json_response({"accepted": True, "run": run.to_json() if run else None})

    async def bulk(self, request: Request) -> Response:
        action = path_param(request, "action")
        if action not in BULK_ACTIONS:
            # An unknown action once fell through to "retry": `bulk/delete` retried runs.
            raise BadRequest(f"Unknown bulk action {action!r}: use {' or '.join(BULK_ACTIONS)}.")
        params = _params(request, _BULK_PARAMS)
        compensate = boolean(params, "compensate") or False
        everything = boolean(params, "all")
        query = run_query_kwargs(params)
        if not query and everything is not True:
            # No filter means every run: that must be said, not reached by accident (a
            # filter that was blank, or dropped, once cancelled every live run).
            raise BadRequest(
                f"bulk {action} without a filter would apply to every run: add filters "
                "(status, workflow, tag, namespace, origin, unattributed, attr) or all=true."
            )
        # Through `as_run_query`, as the list does, so `attr` filters (mappings) are read the
        # same way and a bulk action hits exactly the set the list shows.
        if action == "cancel" and query:
            # The engine's own bulk verb, bounded the same way; it skips settled runs.
            matched = await self.engine.store.list_runs(
                lists.as_run_query(**query, limit=BULK_LIMIT)
            )
            cancelled = await self.engine.cancel_where(
                compensate=compensate, limit=BULK_LIMIT, **query
            )
            return json_response({"matched": len(matched), "applied": len(cancelled)})
        runs = await self.engine.store.list_runs(lists.as_run_query(**query, limit=BULK_LIMIT))
        applied = 0
        for run in runs:
            try:
                if action == "cancel":
                    await self.engine.cancel(run.id, compensate=compensate)
                else:
                    await self.engine.retry(run.id)
            except Exception:
                log.warning("durably dashboard: bulk %s of %s failed", action, run.id)
                continue
            applied += 1
        return json_response({"matched": len(runs), "applied": applied})

    async def webhook(self, request: Request) -> Response:
        """Deliver the body to the run waiting on `token` NOW; store nothing otherwise.

        Decision: unlike `engine.signal`, the webhook never buffers. Anyone who can reach
        the endpoint could otherwise plant a payload that a run started later would take
        at once (and keep it around until it expires). A sender that is early gets 404
        and retries, as webhook senders do."""
        _params(request, _NONE)
        token = path_param(request, "token")
        if not token:
            raise BadRequest("The webhook token is empty: POST <api>/webhooks/<token>.")
        body = await _json_body(request, max_bytes=self._max_bytes)
        result = await self.engine.signal(token, body, buffer=False)
        if result is None:
            return error_response(404, f"no run is waiting on webhook {token} (nothing was stored)")
        return _result(result)

    async def buffered_signals(self, request: Request) -> Response:
        """`GET signals/buffered?prefix=&limit=&offset=`: one page of buffered signals
        (token, size, when buffered, when it expires — never the payload) and the total."""
        params = _params(request, PAGE_PARAMS | {"prefix"})
        limit, offset = page(params)
        prefix = _prefix_param(params)
        items = await self.engine.list_buffered_signals(prefix=prefix, limit=limit, offset=offset)
        total = await self.engine.count_buffered_signals(prefix=prefix)
        return json_response(
            {
                "items": [item.to_json() for item in items],
                "total": total,
                "limit": limit,
                "offset": offset,
            }
        )

    async def purge_signals(self, request: Request) -> Response:
        """`POST signals/buffered/purge` with `{token?, prefix?, expiredOnly?, all?}`:
        deletes what was chosen explicitly; `{purged: n}`. An empty choice is a 400, never
        "everything" (the engine's own completion records are never deleted)."""
        _params(request, _NONE)
        body = await _json_body(request, {}, max_bytes=self._max_bytes)
        if not isinstance(body, dict):
            raise BadRequest("Body must be a JSON object {token?, prefix?, expiredOnly?, all?}.")
        unknown = set(body) - {"token", "prefix", "expiredOnly", "all"}
        if unknown:
            raise BadRequest(
                f"Unknown purge field {', '.join(sorted(map(repr, unknown)))}: use token, "
                "prefix, expiredOnly or all."
            )
        token, prefix = body.get("token"), body.get("prefix")
        for name, value in (("token", token), ("prefix", prefix)):
            if value is not None and (not isinstance(value, str) or not value):
                raise BadRequest(f"`{name}` must be a non-empty string.")
        expired_only, everything = body.get("expiredOnly", False), body.get("all", False)
        if not isinstance(expired_only, bool) or not isinstance(everything, bool):
            raise BadRequest("`expiredOnly` and `all` must be true or false.")
        if token is None and prefix is None and not expired_only and not everything:
            raise BadRequest(
                "Say what to purge: {token}, {prefix}, {expiredOnly: true} or {all: true}."
            )
        try:
            purged = await self.engine.purge_buffered_signals(
                token=token, prefix=prefix, expired_only=expired_only, all=everything
            )
        except ValueError as exc:  # e.g. two scopes at once
            raise BadRequest(str(exc)) from None
        return json_response({"purged": purged})

    # ------------------------------------------------------------------ operations

    async def metrics(self, request: Request) -> Response:
        _params(request, _NONE)
        return Response(await self._prometheus.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def workers(self, request: Request) -> Response:
        """`GET workers`: `GroupHealth[]` — the store's groups, then one per routing token of
        each transport that says which workers are live, with their reported load and what
        their descriptors say."""
        _params(request, _NONE)
        if self.worker is None:
            return _needs_engine("worker health")
        groups = await self.worker.worker_health()
        return json_response([g.to_json() for g in groups])

    async def workflow_directory(self, request: Request) -> Response:
        """`GET workers/directory`: the workflows the live workers announce, with every
        disagreement between them (an onError route set the workers disagree on is not
        followed), and a sentence saying what the answer means."""
        _params(request, _NONE)
        if self.worker is None:
            return _needs_engine("the workflow directory")
        directory = await self.worker.workflow_directory()
        return json_response(directory.to_json())

    async def queues(self, request: Request) -> Response:
        """`GET queues`: the flow-control queues registered on this engine — their settings,
        the slots held and places in line on the admission backend (fleet-wide when it is
        shared), admissions in the current rate window, why a step asking now would be turned
        away (`blocked`: "concurrency", "rate" or null), and this engine's admitted and denied
        counts."""
        _params(request, _NONE)
        if self.worker is None:
            return _needs_engine("flow-control queues")
        return json_response([q.to_json() for q in await self.worker.queue_stats()])

    async def topology(self, request: Request) -> Response:
        _params(request, _NONE)
        return json_response({"role": "control-plane"})


NEEDS_ENGINE_MESSAGE = (
    "This durable console was created over a durably.Client, which runs no worker: "
    "{panel} needs a durably.Engine (create_app(engine))."
)


def _needs_engine(panel: str) -> Response:
    """501: the panel is answered only by a worker, and this console has none."""
    return error_response(501, NEEDS_ENGINE_MESSAGE.format(panel=panel))


# How much of a blocked run's reason a list row carries (the run's page has all of it).
_REASON_CHARS = 300


def _list_row(item: RunListItem) -> dict[str, Any]:
    """A list row; a `blocked` run's row also says why it is parked (`blockedReason`: its
    error's code and the first characters of its message), which the row's `error` — left
    out of list rows, it can be large — would otherwise hide."""
    row: dict[str, Any] = item.to_row_json()
    run = item.run
    if run.status == "blocked" and run.error is not None:
        row["blockedReason"] = {
            "code": run.error.code,
            "message": run.error.message[:_REASON_CHARS],
        }
    return row
