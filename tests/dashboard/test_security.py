"""What the console checks before it acts: the Host header, same-origin mutations, JSON
bodies of a bounded size, the security headers of every answer, the session cookie's
SameSite policy and the login's `returnTo`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import durably
from durably import Engine, WorkflowCtx
from durably.dashboard import create_app
from durably.dashboard.security import DEFAULT_MAX_BODY_BYTES

from .conftest import client_for, wait_status

SECRET = "s3cret-0123456789abcdef"
JSON = {"Content-Type": "application/json"}


def _login(username: str, password: str) -> Any:
    return {"id": "u1"} if password == "pw" else None


async def _sleeping_run(engine: Engine, uid: str) -> str:
    @durably.workflow(f"{uid}.sleeper")
    async def sleeper(ctx: WorkflowCtx, x: int) -> int:
        await ctx.sleep(600)
        return x

    run_id = f"{uid}-asleep"
    await engine.start(sleeper, 1, run_id=run_id)
    await wait_status(engine, run_id, "suspended")
    return run_id


async def _status(engine: Engine, run_id: str) -> str:
    run = await engine.get_run(run_id)
    assert run is not None
    return run.status


# ---------------------------------------------------------------------- headers


async def test_every_answer_carries_the_security_headers(engine: Engine) -> None:
    app = create_app(engine, auth={"secret": SECRET, "login": _login})
    async with client_for(app) as client:
        answers = [
            await client.get("/login"),  # a page
            await client.get("/assets/login.js"),  # a public asset
            await client.get("/api/runs"),  # 401 JSON
            await client.get("/nowhere"),  # 404
            await client.post("/login", json={"username": "a", "password": "pw"}),
            await client.get("/", headers={"Host": "evil.example"}),  # refused host
        ]
    for res in answers:
        assert res.headers["x-frame-options"] == "DENY", res.request.url
        assert res.headers["x-content-type-options"] == "nosniff", res.request.url
        csp = res.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp


async def test_the_pages_have_no_inline_script_or_style(engine: Engine) -> None:
    login = create_app(engine, auth={"secret": SECRET, "login": _login})
    session = create_app(engine, auth={"secret": SECRET, "session": _login})
    async with client_for(login) as a, client_for(session) as b:
        pages = [(await a.get("/login")).text, (await b.get("/")).text]
    async with client_for(create_app(engine)) as plain:
        pages.append((await plain.get("/")).text)
    for page in pages:
        assert "<style" not in page and " style=" not in page
        for script in page.split("<script")[1:]:
            tag = script[: script.index(">")]
            # a data block or an external module, never code in the page
            assert 'type="application/json"' in tag or " src=" in tag, tag


# ---------------------------------------------------------------------- Host


async def test_only_the_configured_host_names_are_served(engine: Engine) -> None:
    async with client_for(create_app(engine)) as client:
        for host in ("localhost", "localhost:8080", "127.0.0.1:9", "[::1]:8000"):
            assert (await client.get("/api/runs", headers={"Host": host})).status_code == 200
        for host in ("evil.example", "localhost.evil.example", "127.0.0.2", ""):
            res = await client.get("/api/runs", headers={"Host": host})
            assert res.status_code == 400, host
            assert "Host" in res.json()["message"]

    app = create_app(engine, allowed_hosts=["ops.example.com", ".corp.example"])
    async with client_for(app, "http://ops.example.com") as client:
        assert (await client.get("/api/runs")).status_code == 200
        ok = await client.get("/api/runs", headers={"Host": "a.b.corp.example:443"})
        assert ok.status_code == 200
        assert (await client.get("/api/runs", headers={"Host": "corp.example"})).status_code == 200
        bad = await client.get("/api/runs", headers={"Host": "localhost"})
        assert bad.status_code == 400 and "localhost" in bad.json()["message"]

    anything = create_app(engine, allowed_hosts=["*"])
    async with client_for(anything, "http://whatever.example") as client:
        assert (await client.get("/api/runs")).status_code == 200


# ---------------------------------------------------------------------- same-origin mutations

CROSS_SITE = [
    {"Origin": "http://evil.example", **JSON},
    {"Origin": "http://localhost:9999", **JSON},  # another port is another origin
    {"Origin": "null", **JSON},
    {"Sec-Fetch-Site": "cross-site", **JSON},
    {"Sec-Fetch-Site": "same-site", **JSON},
    {"Origin": "http://localhost", "Content-Type": "application/x-www-form-urlencoded"},
    {"Origin": "http://localhost", "Content-Type": "text/plain"},
    {"Content-Type": "multipart/form-data; boundary=x"},
]


@pytest.mark.parametrize("headers", CROSS_SITE, ids=lambda h: ",".join(h.values()))
async def test_a_cross_site_request_cancels_nothing(
    engine: Engine, uid: str, headers: dict[str, str]
) -> None:
    run_id = await _sleeping_run(engine, uid)
    async with client_for(create_app(engine)) as client:
        res = await client.post(f"/api/runs/{run_id}/cancel", headers=headers, content=b"x=1")
        assert res.status_code in (403, 415), res.text
        assert set(res.json()) == {"statusCode", "message", "error"}
        bulk = await client.post("/api/bulk/cancel?all=true", headers=headers)
        assert bulk.status_code in (403, 415), bulk.text
    assert await _status(engine, run_id) == "suspended"


async def test_same_origin_and_non_browser_mutations_pass(engine: Engine, uid: str) -> None:
    run_id = await _sleeping_run(engine, uid)
    async with client_for(create_app(engine)) as client:
        # the console's own fetch: same origin, JSON
        same = {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin", **JSON}
        res = await client.post(f"/api/runs/{run_id}/cancel", headers=same)
        assert res.status_code == 200, res.text
    assert await _status(engine, run_id) == "cancelled"

    other = await _sleeping_run(engine, uid + "b")
    async with client_for(create_app(engine)) as client:
        # a script without a browser: no Origin, no body, no content type
        assert (await client.post(f"/api/runs/{other}/cancel")).status_code == 200
    assert await _status(engine, other) == "cancelled"


async def test_a_proxy_with_tls_keeps_the_origin_check(engine: Engine, uid: str) -> None:
    run_id = await _sleeping_run(engine, uid)
    app = create_app(engine, allowed_hosts=["ops.example.com"])
    async with client_for(app, "http://ops.example.com") as client:
        headers = {"Origin": "https://ops.example.com", "X-Forwarded-Proto": "https", **JSON}
        wrong = {**headers, "Origin": "https://ops.example.com:8443"}
        assert (await client.post(f"/api/runs/{run_id}/cancel", headers=wrong)).status_code == 403
        res = await client.post(f"/api/runs/{run_id}/cancel", headers=headers)
        assert res.status_code == 200, res.text


async def test_login_session_and_logout_refuse_cross_site_requests(engine: Engine) -> None:
    def session(request: Any) -> Any:
        return {"id": "host-user"}

    app = create_app(engine, auth={"secret": SECRET, "login": _login, "session": session})
    evil = {"Origin": "http://evil.example"}
    async with client_for(app) as client:
        res = await client.post("/login", json={"username": "a", "password": "pw"}, headers=evil)
        assert res.status_code == 403 and "set-cookie" not in res.headers
        form = await client.post(
            "/login",
            content=b"username=a&password=pw",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert form.status_code == 415 and "set-cookie" not in form.headers
        res = await client.post("/session", headers=evil)
        assert res.status_code == 403 and "set-cookie" not in res.headers
        out = await client.get("/logout", headers={"Sec-Fetch-Site": "cross-site"})
        assert out.status_code == 403 and "set-cookie" not in out.headers
        typed = await client.get("/logout", headers={"Sec-Fetch-Site": "none"})
        assert typed.status_code == 302 and "Max-Age=0" in typed.headers["set-cookie"]
        ok = await client.post("/login", json={"username": "a", "password": "pw"})
        assert ok.status_code == 200


async def test_the_session_cookie_is_same_site_strict(engine: Engine) -> None:
    app = create_app(engine, auth={"secret": SECRET, "login": _login})
    async with client_for(app) as client:
        ok = await client.post("/login", json={"username": "a", "password": "pw"})
        assert "SameSite=Strict" in ok.headers["set-cookie"]
        out = await client.get("/logout")
        assert "SameSite=Strict" in out.headers["set-cookie"]


# ---------------------------------------------------------------------- body size


async def _chunks(sizes: list[int], pulled: list[int]) -> AsyncIterator[bytes]:
    for size in sizes:
        pulled.append(size)
        yield b" " * size


async def test_a_larger_body_is_refused_without_reading_it(engine: Engine) -> None:
    async with client_for(create_app(engine, max_body_bytes=1024)) as client:
        small = await client.post("/api/webhooks/wh:x", content=b"{}", headers=JSON)
        assert small.status_code != 413
        declared = await client.post("/api/webhooks/wh:x", content=b"1" * 2000, headers=JSON)
        assert declared.status_code == 413
        assert "1024" in declared.json()["message"]

        pulled: list[int] = []
        streamed = await client.post(
            "/api/webhooks/wh:x", content=_chunks([600] * 100, pulled), headers=JSON
        )
        assert streamed.status_code == 413
        assert sum(pulled) < 4 * 1024, sum(pulled)  # stopped soon after the limit

    assert DEFAULT_MAX_BODY_BYTES == 1024 * 1024
    async with client_for(create_app(engine)) as client:
        big = b"[" + b"0," * (DEFAULT_MAX_BODY_BYTES // 2) + b"0]"
        assert (
            await client.post("/api/webhooks/wh:x", content=big, headers=JSON)
        ).status_code == 413


# ---------------------------------------------------------------------- returnTo

SAFE = ["/durable/", "/durable/#/runs/abc", "/durable?x=1", "/durable/#/runs?status=failed"]
UNSAFE = [
    "/\\evil.example",
    "/%5Cevil.example",
    "//evil.example",
    "///evil.example",
    "https://evil.example",
    "javascript:alert(1)",
    "/durable/../evil",
    "/durable/%2e%2e/evil",
    "/other/path",
    "/durable\t/x",
    "/durable/\r\nx",
    "durable/",
    "http:/durable/",
    "/durablex",
    "",
    42,
]


@pytest.mark.parametrize("target", UNSAFE, ids=repr)
async def test_login_never_redirects_off_the_console(engine: Engine, target: Any) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(
        routes=[Mount("/durable", app=create_app(engine, auth={"secret": SECRET, "login": _login}))]
    )
    async with client_for(host) as client:
        res = await client.post(
            "/durable/login", json={"username": "a", "password": "pw", "returnTo": target}
        )
        assert res.status_code == 200
        assert res.json() == {"redirectTo": "/durable"}


@pytest.mark.parametrize("target", SAFE)
async def test_login_returns_to_a_console_page(engine: Engine, target: str) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(
        routes=[Mount("/durable", app=create_app(engine, auth={"secret": SECRET, "login": _login}))]
    )
    async with client_for(host) as client:
        res = await client.post(
            "/durable/login", json={"username": "a", "password": "pw", "returnTo": target}
        )
        assert res.json() == {"redirectTo": target}
