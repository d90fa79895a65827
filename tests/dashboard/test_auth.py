"""The console's session-cookie login (cookie, guards, sliding renewal, routes)."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount

from durably import Engine
from durably.dashboard import DashboardConfigError, create_app
from durably.dashboard.cookie import (
    COOKIE_NAME,
    parse_cookie_header,
    parse_ttl,
    sign_session,
    verify_session,
)

from .conftest import client_for

SECRET = "s3cret-0123456789abcdef"
HOUR = 3_600_000


def _login(username: str, password: str) -> Any:
    return {"id": "u1", "name": username, "roles": ["ops"]} if password == "pw" else None


async def _session(request: Request) -> Any:
    user = request.headers.get("x-host-user")
    if user == "boom":
        raise RuntimeError("host auth exploded")
    return {"id": user} if user else None


def _cookie_of(res: httpx.Response) -> str:
    header = res.headers["set-cookie"]
    assert header.startswith(f"{COOKIE_NAME}=")
    return unquote(header.split(";")[0].split("=", 1)[1])


def test_cookie_format_and_verification() -> None:
    now = 1_700_000_000_000
    value = sign_session(SECRET, {"id": "u1", "name": "n", "roles": ["a"]}, now, HOUR)
    payload = verify_session(SECRET, value, now + 1)
    assert payload == {"sub": "u1", "name": "n", "roles": ["a"], "iat": now, "exp": now + HOUR}
    assert verify_session("other", value, now) is None
    assert verify_session(SECRET, value[:-2], now) is None
    body, sig = value.split(".")
    assert verify_session(SECRET, body[:-1] + "A." + sig, now) is None
    assert verify_session(SECRET, "nodot", now) is None
    assert verify_session(SECRET, "." + sig, now) is None
    assert verify_session(SECRET, value, now + HOUR + 29_000) is not None  # skew grace
    assert verify_session(SECRET, value, now + HOUR + 31_000) is None
    assert parse_cookie_header(f'a=1; {COOKIE_NAME}="x%2Ey"; {COOKIE_NAME}=2') == "x.y"
    assert parse_cookie_header("a=1") is None
    assert parse_ttl("1 day") == 24 * HOUR and parse_ttl(" 30m ") == 30 * 60_000
    assert parse_ttl("2d") == 48 * HOUR and parse_ttl("30min") == 30 * 60_000
    assert parse_ttl(90) == 90_000  # a number is seconds, as everywhere in the Python API
    for bad in ("1 fortnight", "8 hours later", "", "0s", "-1h"):
        with pytest.raises(ValueError, match="session ttl"):
            parse_ttl(bad)


def test_boot_errors(engine: Engine) -> None:
    with pytest.raises(DashboardConfigError):
        create_app(engine, auth={"secret": "x-0123456789abcdef"})  # neither hook
    with pytest.raises(DashboardConfigError):
        create_app(engine, auth={"secret": "", "login": _login})
    with pytest.raises(DashboardConfigError):
        create_app(engine, auth={"secret": "x-0123456789abcdef", "login": "not callable"})
    with pytest.raises(DashboardConfigError):
        create_app(engine, auth={"login": _login})
    create_app(engine, auth={"secret": "x-0123456789abcdef", "login": _login, "ttl": "1 day"})
    with pytest.raises(DashboardConfigError, match="'1 fortnight'"):
        create_app(
            engine, auth={"secret": "x-0123456789abcdef", "login": _login, "ttl": "1 fortnight"}
        )


async def test_login_mode_guards_login_and_logout(engine: Engine) -> None:
    app = create_app(engine, auth={"secret": SECRET, "login": _login, "session": _session})
    host = Starlette(routes=[Mount("/durable", app=app)])
    async with client_for(host) as client:
        res = await client.get("/durable/api/runs")
        assert res.status_code == 401
        assert res.json() == {"auth": {"modes": ["session", "login"]}}
        res = await client.get("/durable/?x=1")
        assert res.status_code == 302
        assert res.headers["location"] == "/durable/login?returnTo=%2Fdurable%2F%3Fx%3D1"

        page = await client.get("/durable/login")
        assert page.status_code == 200 and "<form" in page.text
        assert page.headers["cache-control"] == "no-store, must-revalidate"

        bad = await client.post("/durable/login", json={"username": "a"})
        assert bad.status_code == 400
        assert bad.json()["message"] == "Body must include string `username` and `password`."
        wrong = await client.post("/durable/login", json={"username": "a", "password": "no"})
        assert wrong.status_code == 401
        assert wrong.json() == {"message": "Invalid username or password."}
        assert "set-cookie" not in wrong.headers

        ok = await client.post(
            "/durable/login", json={"username": "a", "password": "pw", "returnTo": "/durable/x"}
        )
        assert ok.status_code == 200 and ok.json() == {"redirectTo": "/durable/x"}
        attrs = [a.strip() for a in ok.headers["set-cookie"].split(";")]
        assert {"Path=/", "HttpOnly", "SameSite=Strict", "Max-Age=28800"} <= set(attrs)
        assert "Secure" not in attrs
        cookie = _cookie_of(ok)
        jar = {"Cookie": f"{COOKIE_NAME}={cookie}"}
        assert (await client.get("/durable/api/runs", headers=jar)).json() == []
        assert (await client.get("/durable/", headers=jar)).status_code == 200
        assert (await client.get("/durable/assets/console.css", headers=jar)).status_code == 200

        tampered = {"Cookie": f"{COOKIE_NAME}={cookie[:-3]}abc"}
        assert (await client.get("/durable/api/runs", headers=tampered)).status_code == 401

        for evil in ("//evil.com", "https://evil.com", 42):
            res = await client.post(
                "/durable/login", json={"username": "a", "password": "pw", "returnTo": evil}
            )
            assert res.json() == {"redirectTo": "/durable"}

        https = await client.post(
            "/durable/login",
            json={"username": "a", "password": "pw"},
            headers={"X-Forwarded-Proto": "http, HTTPS"},
        )
        assert "Secure" in https.headers["set-cookie"]

        out = await client.get("/durable/logout", headers=jar)
        assert out.status_code == 302 and out.headers["location"] == "/durable/login"
        cleared = out.headers["set-cookie"]
        assert cleared.startswith(f"{COOKIE_NAME}=;") and "Max-Age=0" in cleared
        assert "Expires=Thu, 01 Jan 1970 00:00:00 GMT" in cleared

        # Mode A: the host's own auth mints the cookie
        assert (await client.post("/durable/session")).status_code == 401
        assert (
            await client.post("/durable/session", headers={"x-host-user": "boom"})
        ).status_code == 401
        minted = await client.post("/durable/session", headers={"x-host-user": "alice"})
        assert minted.status_code == 204
        payload = verify_session(SECRET, _cookie_of(minted), int(time.time() * 1000))
        assert payload is not None and payload["sub"] == "alice"


async def test_session_only_mode(engine: Engine) -> None:
    app = create_app(engine, auth={"secret": SECRET, "session": _session})
    async with client_for(app) as client:
        res = await client.get("/")
        assert res.status_code == 401 and "Session required" in res.text
        assert (await client.get("/login")).status_code == 404
        assert (await client.post("/login", json={})).status_code == 404
        assert (await client.get("/api/runs")).json() == {"auth": {"modes": ["session"]}}
        out = await client.get("/logout")
        assert out.status_code == 302 and out.headers["location"] == "/"

    def page(request: Request, base: str) -> str:
        return f"<p>go sign in, then come back to {base}</p>"

    custom = create_app(
        engine, auth={"secret": SECRET, "session": _session, "unauthenticated_page": page}
    )
    async with client_for(custom) as client:
        res = await client.get("/")
        assert res.status_code == 401 and "go sign in" in res.text


async def test_sliding_renewal(engine: Engine) -> None:
    calls: list[str] = []
    verdict = {"ok": True}

    async def revalidate(session: dict[str, Any]) -> bool:
        calls.append(session["sub"])
        await asyncio.sleep(0.05)
        return verdict["ok"]

    app = create_app(
        engine, auth={"secret": SECRET, "login": _login, "revalidate": revalidate, "ttl": "1h"}
    )
    now = int(time.time() * 1000)
    fresh = sign_session(SECRET, {"id": "u1"}, now - 10 * 60_000, HOUR)
    old = sign_session(SECRET, {"id": "u1"}, now - 40 * 60_000, HOUR)
    async with client_for(app) as client:
        res = await client.get("/api/runs", headers={"Cookie": f"{COOKIE_NAME}={fresh}"})
        assert res.status_code == 200 and "set-cookie" not in res.headers and calls == []

        jar = {"Cookie": f"{COOKIE_NAME}={old}"}
        first, second = await asyncio.gather(
            client.get("/api/runs", headers=jar), client.get("/api/runs", headers=jar)
        )
        assert calls == ["u1"]  # concurrent renewals share one hook call
        for res in (first, second):
            assert res.status_code == 200
            renewed = verify_session(SECRET, _cookie_of(res), now)
            assert renewed is not None and renewed["iat"] >= now

        verdict["ok"] = False
        denied = await client.get("/api/runs", headers=jar)
        assert denied.status_code == 401 and "Max-Age=0" in denied.headers["set-cookie"]
        page = await client.get("/", headers=jar)
        assert page.status_code == 302 and "Max-Age=0" in page.headers["set-cookie"]


async def test_metrics_are_behind_the_same_login_and_guards(engine: Engine) -> None:
    """The exposition is read data like any other route: no session, no metrics; a host
    guard refusing the request refuses them too."""
    app = create_app(engine, auth={"secret": SECRET, "login": _login, "session": _session})
    async with client_for(app) as client:
        assert (await client.get("/api/metrics")).status_code == 401
        cookie = sign_session(SECRET, {"id": "u1"}, int(time.time() * 1000), HOUR)
        signed = await client.get("/api/metrics", headers={"Cookie": f"{COOKIE_NAME}={cookie}"})
        assert signed.status_code == 200
        assert signed.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "# TYPE durable_runs gauge" in signed.text
    guarded = create_app(engine, guards=[lambda request: False])
    async with client_for(guarded) as client:
        assert (await client.get("/api/metrics")).status_code == 403
