"""The console's schedules routes over `client.schedules` / `engine.schedules`.

`GET schedules` (`workflow=`, `paused=`, `limit=`) lists them, `GET schedules/:id` describes
one, and `POST schedules/:id/pause` (`{note?}`), `.../unpause` and `.../trigger` change a
persisted one. They are mounted by `DashboardApi` like every other route, so a change goes
through the same front door (same origin, JSON content type, auth, read-only mode).

Decision: a static schedule (declared in code with `Engine(schedules=...)`) is read-only in
the console — its pause, unpause AND trigger answer 409 — because the console shows what the
code declares and changes only what lives in the store; the schedule client itself refuses
pausing one, and triggering one by hand stays a call from code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from durably._core.bounds import loads_untrusted
from durably._core.errors import ScheduleNotFoundError
from durably._engine.client.handle import RunHandle
from durably._engine.client.schedule_views import ScheduleDescription
from durably.dashboard.filters import BadRequest, MultiParams, boolean, check_known, integer
from durably.dashboard.paths import path_param
from durably.dashboard.responses import error_response, json_response

__all__ = ["LIST_LIMIT", "ScheduleRoutes", "ScheduleVerbs", "describe_json"]

#: `GET schedules` lists at most this many (and 100 when `limit` is not given).
LIST_LIMIT = 1_000
_LIST_DEFAULT = 100
_NOTE_MAX = 1_000
STATIC_MESSAGE = (
    'schedule "{id}" is declared in code (Engine(schedules=...)): the console shows it '
    "read-only; change its declaration instead"
)


class ScheduleVerbs(Protocol):
    """What the schedules routes use of a schedule client."""

    async def list(
        self, *, workflow: str | None = None, paused: bool | None = None, limit: int = 100
    ) -> list[ScheduleDescription]: ...

    async def describe(self, schedule_id: str) -> ScheduleDescription: ...

    async def pause(self, schedule_id: str, note: str | None = None) -> ScheduleDescription: ...

    async def unpause(self, schedule_id: str) -> ScheduleDescription: ...

    async def trigger(self, schedule_id: str) -> RunHandle[Any]: ...


def describe_json(d: ScheduleDescription) -> dict[str, Any]:
    """A description as `durably schedules describe --json` prints it (times in epoch ms),
    plus `lastRunStatus`: the status of `lastRunId` when it is among the recent runs."""
    last_status = next((r.status for r in d.recent_runs if r.run_id == d.last_run_id), None)
    return {**d.to_json(), "lastRunStatus": last_status}


def _params(request: Request, allowed: set[str]) -> MultiParams:
    params = request.query_params
    check_known(params, allowed)
    return params


class ScheduleRoutes:
    """The handlers (module doc), bound to one schedule client."""

    def __init__(self, schedules: ScheduleVerbs, *, max_bytes: int) -> None:
        self._schedules = schedules
        self._max_bytes = max_bytes

    async def list(self, request: Request) -> Response:
        params = _params(request, {"workflow", "paused", "limit"})
        workflows = params.getlist("workflow")
        if len(workflows) > 1 or (workflows and not workflows[0]):
            raise BadRequest("Query parameter `workflow` is given once, and not empty.")
        limit = integer(params, "limit", default=_LIST_DEFAULT, low=0, high=LIST_LIMIT)
        found = await self._schedules.list(
            workflow=workflows[0] if workflows else None,
            paused=boolean(params, "paused"),
            limit=limit,
        )
        return json_response([describe_json(d) for d in found])

    async def describe(self, request: Request) -> Response:
        _params(request, set())
        schedule_id = path_param(request, "schedule_id")
        try:
            return json_response(describe_json(await self._schedules.describe(schedule_id)))
        except ScheduleNotFoundError as exc:
            return error_response(404, str(exc))

    async def pause(self, request: Request) -> Response:
        _params(request, set())
        body = await self._body(request)
        if set(body) - {"note"}:
            raise BadRequest("Body must be a JSON object `{note?}`.")
        note = body.get("note")
        if note is not None and (not isinstance(note, str) or len(note) > _NOTE_MAX):
            raise BadRequest(f"note must be a string of at most {_NOTE_MAX} characters.")
        return await self._change(request, lambda sid: self._schedules.pause(sid, note))

    async def unpause(self, request: Request) -> Response:
        _params(request, set())
        if await self._body(request):
            raise BadRequest("unpause takes no body fields.")
        return await self._change(request, self._schedules.unpause)

    async def trigger(self, request: Request) -> Response:
        _params(request, set())
        if await self._body(request):
            raise BadRequest("trigger takes no body fields.")
        schedule_id = path_param(request, "schedule_id")
        refused = await self._refuse_static(schedule_id)
        if refused is not None:
            return refused
        handle = await self._schedules.trigger(schedule_id)
        return json_response({"runId": handle.run_id, "scheduleId": schedule_id})

    # ------------------------------------------------------------------ parts

    async def _body(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        if not raw.strip():
            return {}
        body = loads_untrusted(raw, what="request body", max_bytes=self._max_bytes)
        if not isinstance(body, dict):
            raise BadRequest("Body must be a JSON object.")
        return body

    async def _refuse_static(self, schedule_id: str) -> Response | None:
        """404 for an unknown id, 409 for a static schedule; None for a persisted one."""
        try:
            found = await self._schedules.describe(schedule_id)
        except ScheduleNotFoundError as exc:
            return error_response(404, str(exc))
        if found.source == "static":
            return error_response(409, STATIC_MESSAGE.format(id=schedule_id))
        return None

    async def _change(
        self, request: Request, verb: Callable[[str], Awaitable[ScheduleDescription]]
    ) -> Response:
        schedule_id = path_param(request, "schedule_id")
        refused = await self._refuse_static(schedule_id)
        if refused is not None:
            return refused
        try:
            changed = await verb(schedule_id)
        except ScheduleNotFoundError as exc:  # deleted in between
            return error_response(404, str(exc))
        return json_response(describe_json(changed))
