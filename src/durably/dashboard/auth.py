"""Optional session-cookie login for the dashboard.

`DashboardAuth(secret=..., ttl="8h", session=..., login=..., revalidate=...,
unauthenticated_page=...)`: unset → the console is open. Mode A `session(request)` checks the
host's own auth on `POST <base>/session`; Mode B `login(username, password)` backs the built-in
login page. Hooks may be sync or async and return a user `{id, name?, roles?}` (a mapping or an
object with those attributes) or None; a raising hook is a denial (logged once per hook kind).
Invalid configuration (an unreadable `ttl` included) raises `DashboardConfigError` when the
app is built.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from durably._core.bounds import PayloadRejectedError, loads_untrusted
from durably._core.durations import Duration
from durably._core.log_context import durably_logger
from durably.dashboard.config import DashboardConfigError
from durably.dashboard.cookie import (
    clear_cookie_header,
    is_https,
    parse_cookie_header,
    parse_ttl,
    secret_problem,
    set_cookie_header,
    sign_session,
    verify_session,
)
from durably.dashboard.pages import login_page, session_required_page
from durably.dashboard.responses import error_response, json_response
from durably.dashboard.security import cross_site_refusal

__all__ = ["Authenticator", "DashboardAuth", "DashboardConfigError", "console_page"]

log = durably_logger("durably.dashboard")

Endpoint = Callable[[Request], Awaitable[Response]]
_HOOKS = ("session", "login", "revalidate", "unauthenticated_page")


@dataclass(frozen=True)
class DashboardAuth:
    secret: str
    ttl: Duration = "8h"
    session: Callable[..., Any] | None = None
    login: Callable[..., Any] | None = None
    revalidate: Callable[..., Any] | None = None
    unauthenticated_page: Callable[..., Any] | None = None

    @classmethod
    def of(cls, value: DashboardAuth | Mapping[str, Any]) -> DashboardAuth:
        if isinstance(value, DashboardAuth):
            return value
        if not isinstance(value, Mapping):
            raise DashboardConfigError("auth must be a DashboardAuth or a mapping")
        aliases = {"unauthenticatedPage": "unauthenticated_page"}
        kwargs = {aliases.get(k, k): v for k, v in value.items()}
        unknown = set(kwargs) - {"secret", "ttl", *_HOOKS}
        if unknown:
            raise DashboardConfigError(f"unknown dashboard auth option(s): {sorted(unknown)}")
        if "secret" not in kwargs:
            raise DashboardConfigError("dashboard auth needs a non-empty `secret`")
        return cls(**kwargs)

    def validate(self) -> None:
        """Fail closed: a configuration that cannot authenticate anyone is refused at
        start-up, never served open."""
        problem = secret_problem(self.secret)
        if problem is not None:
            raise DashboardConfigError(f"dashboard auth `secret` refused: {problem}")
        for name in _HOOKS:
            hook = getattr(self, name)
            if hook is not None and not callable(hook):
                raise DashboardConfigError(f"dashboard auth `{name}` must be callable")
        if self.session is None and self.login is None:
            raise DashboardConfigError(
                "dashboard auth needs at least one of `session` (the host's own auth, "
                "Mode A) and `login` (the built-in login page, Mode B)"
            )
        self.ttl_ms()

    def ttl_ms(self) -> int:
        """The session lifetime in milliseconds; `DashboardConfigError` naming the value
        when it is not a duration (never a silent default)."""
        try:
            return parse_ttl(self.ttl)
        except ValueError as exc:
            raise DashboardConfigError(f"dashboard auth: {exc}") from None

    @property
    def modes(self) -> list[str]:
        return [m for m, hook in (("session", self.session), ("login", self.login)) if hook]


def _user_dict(user: Any) -> dict[str, Any] | None:
    if user is None or user is False:
        return None
    if isinstance(user, Mapping):
        data = dict(user)
    else:
        data = {k: getattr(user, k) for k in ("id", "name", "roles") if hasattr(user, k)}
    if data.get("id") is None or data.get("id") == "":
        return None
    return data


def _now_ms() -> int:
    return int(time.time() * 1000)


class Authenticator:
    """Guards and auth routes for one app (one configuration)."""

    def __init__(self, config: DashboardAuth, base_path: str) -> None:
        config.validate()
        self.config = config
        self.base_path = base_path  # normalised, "" for the root
        self.ttl_ms = config.ttl_ms()
        self.modes = config.modes
        self._logged: set[str] = set()
        self._renewals: dict[tuple[str, str], asyncio.Future[bool]] = {}

    # ------------------------------------------------------------------ helpers

    def external_base(self, request: Request) -> str:
        return (request.scope.get("root_path", "") or "") + self.base_path or "/"

    def _external_path(self, request: Request, path: str) -> str:
        return (request.scope.get("root_path", "") or "") + self.base_path + path

    async def _call(self, kind: str, *args: Any) -> Any:
        hook = getattr(self.config, kind)
        try:
            value = hook(*args)
            if inspect.isawaitable(value):
                value = await value
            return value
        except Exception:
            if kind not in self._logged:
                self._logged.add(kind)
                log.exception("durably dashboard: the %s hook raised (treated as a denial)", kind)
            return None

    def _secure(self, request: Request) -> bool:
        return is_https(request.url.scheme, request.headers.get("x-forwarded-proto"))

    def _issue(self, request: Request, response: Response, user: Mapping[str, Any]) -> None:
        value = sign_session(self.config.secret, user, _now_ms(), self.ttl_ms)
        response.headers.append(
            "set-cookie", set_cookie_header(value, self.ttl_ms, self._secure(request))
        )

    def _clear(self, request: Request, response: Response) -> None:
        response.headers.append("set-cookie", clear_cookie_header(self._secure(request)))

    # ------------------------------------------------------------------ session check

    async def _revalidate(self, payload: Mapping[str, Any]) -> bool:
        if self.config.revalidate is None:
            return True
        key = (self.config.secret, str(payload["sub"]))
        pending = self._renewals.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._renewals[key] = future
        try:
            verdict = await self._call("revalidate", dict(payload)) is True
            future.set_result(verdict)
            return verdict
        finally:
            if not future.done():
                future.set_result(False)
            del self._renewals[key]

    async def check(self, request: Request) -> tuple[str, dict[str, Any] | None]:
        """('ok' | 'renew' | 'deny' | 'revoked', payload)."""
        value = parse_cookie_header(request.headers.get("cookie"))
        now = _now_ms()
        payload = verify_session(self.config.secret, value, now)
        if payload is None:
            return "deny", None
        if now - payload["iat"] <= self.ttl_ms / 2:
            return "ok", payload
        if await self._revalidate(payload):
            return "renew", payload
        return "revoked", payload

    def _renewed_user(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        user: dict[str, Any] = {"id": payload["sub"], "roles": payload.get("roles", [])}
        if "name" in payload:
            user["name"] = payload["name"]
        return user

    # ------------------------------------------------------------------ guards

    def guard_api(self, endpoint: Endpoint) -> Endpoint:
        async def denied(request: Request) -> Response:
            return json_response({"auth": {"modes": self.modes}}, 401)

        return self._guard(endpoint, denied)

    def guard_ui(self, endpoint: Endpoint) -> Endpoint:
        return self._guard(endpoint, self._denied_page)

    def _guard(self, endpoint: Endpoint, denied: Endpoint) -> Endpoint:
        """`endpoint` behind the session check: `denied` answers a missing or revoked session
        (a revoked cookie is cleared), a session due for renewal is re-issued."""

        async def guarded(request: Request) -> Response:
            verdict, payload = await self.check(request)
            if verdict in ("deny", "revoked"):
                response = await denied(request)
                if verdict == "revoked":
                    self._clear(request, response)
                return response
            response = await endpoint(request)
            if verdict == "renew" and payload is not None:
                self._issue(request, response, self._renewed_user(payload))
            return response

        return guarded

    async def _denied_page(self, request: Request) -> Response:
        if "login" in self.modes:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            location = (
                self._external_path(request, "/login") + "?returnTo=" + quote(target, safe="")
            )
            return RedirectResponse(location, status_code=302)
        if self.config.unauthenticated_page is not None:
            page = await self._call("unauthenticated_page", request, self.external_base(request))
            if isinstance(page, Response):
                return page
            if isinstance(page, str) and page:
                return HTMLResponse(page, status_code=401, headers=_NO_STORE)
        assets = self._external_path(request, "/assets")
        return HTMLResponse(session_required_page(assets), status_code=401, headers=_NO_STORE)

    # ------------------------------------------------------------------ routes

    async def login_page(self, request: Request) -> Response:
        if "login" not in self.modes:
            return error_response(404, "Not Found")
        page = login_page(
            self._external_path(request, "/login"), self._external_path(request, "/assets")
        )
        return HTMLResponse(page, headers=_NO_STORE)

    async def login(self, request: Request) -> Response:
        if "login" not in self.modes:
            return error_response(404, "Not Found")
        try:
            body = loads_untrusted(await request.body(), what="login body")
        except PayloadRejectedError:
            body = None
        if not isinstance(body, dict) or not (
            isinstance(body.get("username"), str) and isinstance(body.get("password"), str)
        ):
            return error_response(400, "Body must include string `username` and `password`.")
        user = _user_dict(await self._call("login", body["username"], body["password"]))
        if user is None:
            return json_response({"message": "Invalid username or password."}, 401)
        base = self.external_base(request)
        return_to = body.get("returnTo")
        redirect_to = return_to if console_page(return_to, base) else base
        response = json_response({"redirectTo": redirect_to})
        self._issue(request, response, user)
        return response

    async def session(self, request: Request) -> Response:
        if "session" not in self.modes:
            return error_response(404, "Not Found")
        user = _user_dict(await self._call("session", request))
        if user is None:
            return error_response(401, "Session denied.")
        response = Response(status_code=204)
        self._issue(request, response, user)
        return response

    async def logout(self, request: Request) -> Response:
        # A GET that changes state: a link or image on another site must not sign the
        # operator out. Navigations carry Sec-Fetch-Site, so only the console's own link
        # and a typed URL clear the cookie.
        refusal = cross_site_refusal(request.headers, request.url.scheme)
        if refusal is not None:
            return error_response(403, refusal)
        if "login" in self.modes:
            location = self._external_path(request, "/login")
        else:
            location = self.external_base(request)
        response = RedirectResponse(location, status_code=302)
        self._clear(request, response)
        return response


_NO_STORE = {"Cache-Control": "no-store, must-revalidate"}


def console_page(target: Any, base: str) -> bool:
    """Whether a login's `returnTo` is a page of this console: a relative reference whose
    path is `base` or below it, parsed (never pattern-matched). Refused: anything with a
    scheme or a host (`https://x`, `//x`, `javascript:`), a backslash (browsers read `/\\x`
    as `//x`), control characters and spaces, dot segments that climb out of `base`
    (encoded or not), and paths elsewhere on the host (another app's page is not ours to
    send people to)."""
    if not isinstance(target, str) or not target.startswith("/"):
        return False
    if "\\" in target or any(ord(c) < 0x21 or ord(c) == 0x7F for c in target):
        return False
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or target.startswith("//"):
        return False
    path = unquote(parts.path)
    if "\\" in path or any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        return False
    if any(segment in (".", "..") for segment in path.split("/")):
        return False
    root = base.rstrip("/")
    return path == (root or "/") or path.startswith(root + "/")
