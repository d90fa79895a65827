"""`create_app(engine, ...)`: the dashboard as one Starlette ASGI app.

Mount it in a host app, e.g. `Mount("/durable", app=create_app(engine))` in Starlette or
`app.mount("/durable", create_app(engine))` in FastAPI; every route is relative to the mount
point, and links/redirects include the mount's `root_path`. The engine is the host's: open it
in the host's lifespan (`async with engine:`); a `drive=False` engine makes a read replica /
API pod that never executes runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route, Router
from starlette.types import ASGIApp

from durably._engine.client.client import Client
from durably._engine.engine import Engine
from durably.dashboard.api import DashboardApi
from durably.dashboard.auth import Authenticator, DashboardAuth
from durably.dashboard.config import DashboardConfigError
from durably.dashboard.pages import (
    CONSOLE_PAGES,
    PUBLIC_ASSETS,
    asset_bytes,
    asset_type,
    index_html,
)
from durably.dashboard.paths import RawSegments
from durably.dashboard.responses import error_response
from durably.dashboard.security import (
    DEFAULT_MAX_BODY_BYTES,
    ConsoleGate,
    HostPolicy,
    host_policy,
)

__all__ = ["Guard", "create_app", "normalize_path"]

Endpoint = Callable[[Request], Awaitable[Response]]
#: A host guard: returns True to let the request through, False for 403, or a Response.
Guard = Callable[[Request], "bool | Response | Awaitable[bool | Response]"]


def normalize_path(path: str) -> str:
    """Leading `/`, no trailing `/`; the root is ""."""
    path = "/" + path.strip().strip("/")
    return "" if path == "/" else path


def _identity(endpoint: Endpoint) -> Endpoint:
    return endpoint


def _host_guards(guards: Sequence[Guard]) -> Callable[[Endpoint], Endpoint]:
    def wrap(endpoint: Endpoint) -> Endpoint:
        if not guards:
            return endpoint

        async def guarded(request: Request) -> Response:
            for guard in guards:
                verdict = guard(request)
                if inspect.isawaitable(verdict):
                    verdict = await verdict
                if isinstance(verdict, Response):
                    return verdict
                if verdict is not True:
                    return error_response(403, "Forbidden by the host's dashboard guard.")
            return await endpoint(request)

        return guarded

    return wrap


class _ConsoleApp(Starlette):
    """Starlette with `ConsoleGate` OUTSIDE its own error middleware, so that every answer —
    a 500 of Starlette's error handler included — passes the gate and carries its headers."""

    def __init__(self, *, hosts: HostPolicy, max_body_bytes: int, **options: Any) -> None:
        super().__init__(**options)
        self._hosts = hosts
        self._max_body_bytes = max_body_bytes

    def build_middleware_stack(self) -> ASGIApp:
        return ConsoleGate(super().build_middleware_stack(), self._hosts, self._max_body_bytes)


def create_app(
    engine: Client | Engine,
    *,
    base_path: str = "/",
    api_base_path: str | None = None,
    read_only: bool = False,
    auth: DashboardAuth | Mapping[str, Any] | None = None,
    guards: Sequence[Guard] = (),
    allowed_hosts: Sequence[str] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    debug: bool = False,
) -> Starlette:
    """The dashboard app: the console at `base_path`, the JSON API at `api_base_path`
    (default `base_path + "/api"`), both relative to where the app is mounted.

    `read_only=True` answers 403 to every mutating endpoint. `auth` (a `DashboardAuth` or
    its mapping form) turns on the session-cookie login; an invalid configuration raises
    `DashboardConfigError` here. `guards` are host callables run before every route (auth
    routes excepted). `allowed_hosts` are the `Host` names the console answers (default:
    localhost, 127.0.0.1, [::1]; `.example.com` for a domain and its subdomains, `["*"]`
    for any, when the host app checks `Host` itself). A request body larger than
    `max_body_bytes` (default 1 MiB) is refused with 413.

    `engine` is an `Engine` or — for a web tier that runs no worker — a `Client`: over a
    client every run, signal and operator panel works from the store, while the panels
    only a worker answers (updates, worker health, the workflow directory, queues) answer
    501 naming what they need, the metrics hold only the store's run gauges and a run's
    stream follows its row (`durably.dashboard.api`)."""
    if not isinstance(engine, Client | Engine):
        raise DashboardConfigError(
            f"create_app needs a durably.Client or durably.Engine, got {type(engine)!r}"
        )
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int):
        raise DashboardConfigError(f"max_body_bytes must be an int, got {max_body_bytes!r}")
    if max_body_bytes < 1:
        raise DashboardConfigError(f"max_body_bytes must be at least 1, got {max_body_bytes}")
    hosts = host_policy(allowed_hosts)
    base = normalize_path(base_path)
    api_base = normalize_path(api_base_path) if api_base_path is not None else base + "/api"
    authenticator = Authenticator(DashboardAuth.of(auth), base) if auth is not None else None
    host = _host_guards(guards)

    def api_wrap(endpoint: Endpoint) -> Endpoint:
        inner = authenticator.guard_api(endpoint) if authenticator else endpoint
        return host(inner)

    def ui_wrap(endpoint: Endpoint) -> Endpoint:
        inner = authenticator.guard_ui(endpoint) if authenticator else endpoint
        return host(inner)

    api = DashboardApi(engine, read_only=read_only)

    async def index(request: Request) -> Response:
        root = request.scope.get("root_path", "") or ""
        text = index_html((root + base) or "/", root + api_base, read_only)
        if text is None:
            return error_response(404, "Dashboard is not built.")
        return HTMLResponse(text, headers={"Cache-Control": "no-store, must-revalidate"})

    async def asset(request: Request) -> Response:
        name = request.path_params["file"]
        data = asset_bytes(name)
        if data is None:
            return error_response(404, f"asset {name} not found")
        return Response(
            data,
            headers={
                "Content-Type": asset_type(name),
                "Cache-Control": "public, max-age=31536000, immutable",
            },
        )

    guarded_asset, public_asset = ui_wrap(asset), host(asset)

    async def any_asset(request: Request) -> Response:
        # The login page's script and style are assets (the CSP allows no inline code) and a
        # visitor without a session must be able to load them: those few names skip the
        # session check (host guards still apply); every other asset needs a session.
        if request.path_params["file"] in PUBLIC_ASSETS:
            return await public_asset(request)
        return await guarded_asset(request)

    routes: list[BaseRoute] = []
    if authenticator is not None:
        routes += [
            Route(base + "/login", authenticator.login_page, methods=["GET"]),
            Route(base + "/login", authenticator.login, methods=["POST"]),
            Route(base + "/session", authenticator.session, methods=["POST"]),
            Route(base + "/logout", authenticator.logout, methods=["GET"]),
        ]
    routes += [
        Route(base + "/assets/{file:path}", any_asset, methods=["GET"]),
        Route(base or "/", ui_wrap(index), methods=["GET"]),
    ]
    if base:
        routes.append(Route(base + "/", ui_wrap(index), methods=["GET"]))
    # Routed on the client's own path segments, so a run id holding `/` stays addressable
    # (`paths.py`).
    routes.append(Mount(api_base, app=RawSegments(Router(routes=api.routes(api_wrap)))))
    # The console's own pages by path (`<base>/runs/<id>`, …): a link opened directly or a
    # page refreshed gets the same shell, whose client-side router reads the path. After the
    # API mount, so an API base inside the console's paths still reaches the API.
    shell = ui_wrap(index)
    for name in CONSOLE_PAGES:
        routes.append(Route(f"{base}/{name}", shell, methods=["GET"]))
        routes.append(Route(f"{base}/{name}/{{rest:path}}", shell, methods=["GET"]))

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(404, f"Cannot {request.method} {request.url.path}")

    async def bad_method(request: Request, exc: Exception) -> Response:
        return error_response(405, f"Cannot {request.method} {request.url.path}")

    app = _ConsoleApp(
        hosts=hosts,
        max_body_bytes=max_body_bytes,
        debug=debug,
        routes=routes,
        exception_handlers={404: not_found, 405: bad_method},
    )
    app.state.durably_engine = engine
    app.state.durably_read_only = read_only
    app.state.durably_base_path = base or "/"
    app.state.durably_api_base_path = api_base
    app.state.durably_allowed_hosts = hosts.listed
    return app
