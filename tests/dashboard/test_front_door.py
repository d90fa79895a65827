"""The console's front door against hostile input, through the real Starlette app over httpx:
a weak signing secret is refused at start, a cookie that is not base64url is a denial (401,
never a 500), a JSON body nested past the limit is a 400, and a run id holding `/` is reachable
on every route (detail, stream, cancel) because the API routes on the client's own segments."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote, unquote

import pytest

import durably
from durably import Engine, WorkflowCtx
from durably._cli.common import Args, CliError
from durably._cli.dashboard import console_options
from durably._cli.main import parse_args
from durably.dashboard import DashboardConfigError, create_app
from durably.dashboard.cookie import COOKIE_NAME

from .conftest import client_for, wait_status

STRONG = "0123456789abcdef-strong"
JSON = {"content-type": "application/json"}


def _login(username: str, password: str) -> Any:
    return {"id": username} if password == "pw" else None


def _args(*argv: str) -> Args:
    return parse_args(["dashboard", "sqlite:///x.db", *argv])


# ---------------------------------------------------------------------- the signing secret


@pytest.mark.parametrize("secret", ["x", "s3cret", "f" * 15, "é" * 7])
def test_a_short_auth_secret_is_refused_by_the_cli(secret: str) -> None:
    env = {"SECRET": secret, "TOKEN": "t0ken"}
    argv = ("--auth-secret-env", "SECRET", "--auth-token-env", "TOKEN")
    with pytest.raises(CliError, match="at least 16"):
        console_options(_args(*argv), env)
    ok = console_options(_args(*argv), {**env, "SECRET": "é" * 8})  # 16 bytes of UTF-8
    assert ok.auth is not None


async def test_a_short_secret_is_refused_by_create_app(engine: Engine) -> None:
    with pytest.raises(DashboardConfigError, match="at least 16"):
        create_app(engine, auth={"secret": "x", "login": _login})
    app = create_app(engine, auth={"secret": STRONG, "login": _login})
    async with client_for(app) as client:
        assert (await client.get("/api/runs")).status_code == 401


# ---------------------------------------------------------------------- the session cookie


@pytest.mark.parametrize("value", ["%C3%A9.x", "x.%C3%A9", "%E2%82%AC%E2%82%AC.abc", "é.é"])
async def test_a_cookie_that_is_not_base64url_is_a_401(engine: Engine, value: str) -> None:
    app = create_app(engine, auth={"secret": STRONG, "login": _login})
    cookie = {"cookie": f"{COOKIE_NAME}={value}".encode()}  # raw UTF-8 bytes for "é.é"
    async with client_for(app) as client:
        res = await client.get("/api/runs", headers=cookie)
        assert res.status_code == 401, res.text
        page = await client.get("/", headers=cookie)
        assert page.status_code == 302  # to the login page, not a 500


# ---------------------------------------------------------------------- request bodies

DEEP = ("[" * 100_000 + "]" * 100_000).encode()


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/some-run/updates/approve",
        "/api/runs/some-run/retry-with-input",
        "/api/webhooks/some-token",
        "/api/signals/buffered/purge",
    ],
)
async def test_a_deeply_nested_body_is_a_400(engine: Engine, path: str) -> None:
    async with client_for(create_app(engine)) as client:
        res = await client.post(path, content=DEEP, headers=JSON)
        assert res.status_code == 400, res.text
        assert "nested deeper" in res.json()["message"]
        nan = await client.post(path, content=b'{"input": NaN}', headers=JSON)
        assert nan.status_code == 400, nan.text


async def test_a_body_over_max_payload_bytes_is_a_413(tmp_path: Any) -> None:
    async with Engine(f"sqlite:///{tmp_path / 'small.db'}", max_payload_bytes=1024) as engine:
        async with client_for(create_app(engine)) as client:
            body = b'{"input": "' + b"x" * 2000 + b'"}'
            res = await client.post("/api/runs/r/retry-with-input", content=body, headers=JSON)
            assert res.status_code == 413, res.text


# ---------------------------------------------------------------------- run ids with `/`


async def _stream_status(app: Any, raw_path: str) -> tuple[int, str]:
    """GET raw_path as an ASGI server sends it (the path decoded, raw_path as sent); the
    status and the first chunk of the body, then the client goes away."""
    sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    gone = asyncio.Event()
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"localhost"), (b"accept", b"text/event-stream")],
        "client": ("127.0.0.1", 1234),
        "server": ("localhost", 80),
    }
    task = asyncio.create_task(app(scope, receive, sent.put))
    start = await asyncio.wait_for(sent.get(), 10)
    body = ""
    if start["status"] == 200:
        body = (await asyncio.wait_for(sent.get(), 10)).get("body", b"").decode()
    gone.set()
    await asyncio.wait_for(task, 10)
    return start["status"], body


async def test_run_ids_holding_a_slash_are_reachable_on_every_route(
    engine: Engine, uid: str
) -> None:
    @durably.workflow(f"{uid}.held")
    async def held(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(f"{uid}-go")

    engine.register(held)
    # `a` and `a/cancel` both exist: a literal `/` is a separator, an encoded one is part of
    # the id, so neither can be mistaken for the other.
    ids = [f"{uid}/orders/2024/17", f"{uid}-a", f"{uid}-a/cancel", f"{uid}/100%/x y"]
    for run_id in ids:
        await engine.start(held, run_id=run_id)
        await wait_status(engine, run_id, "suspended")
    app = create_app(engine)
    async with client_for(app) as client:
        for run_id in ids:
            enc = quote(run_id, safe="")
            detail = await client.get(f"/api/runs/{enc}")
            assert detail.status_code == 200, (run_id, detail.text)
            assert detail.json()["run"]["id"] == run_id
            status, body = await _stream_status(app, f"/api/runs/{enc}/stream")
            assert status == 200 and body.startswith(": connected"), (run_id, status)

        # POST runs/<uid>-a/cancel cancels `<uid>-a`, never `<uid>-a/cancel`
        res = await client.post(f"/api/runs/{uid}-a/cancel", headers=JSON)
        assert res.status_code == 200, res.text
        await wait_status(engine, f"{uid}-a", "cancelled")
        other = await engine.get_run(f"{uid}-a/cancel")
        assert other is not None and other.status == "suspended"

        for run_id in (f"{uid}/orders/2024/17", f"{uid}-a/cancel", f"{uid}/100%/x y"):
            res = await client.post(f"/api/runs/{quote(run_id, safe='')}/cancel", headers=JSON)
            assert res.status_code == 200, (run_id, res.text)
            await wait_status(engine, run_id, "cancelled")

        # an unknown id holding `/` is a plain 404 naming the id
        missing = await client.get(f"/api/runs/{quote('no/such', safe='')}")
        assert missing.status_code == 404 and "no/such" in missing.json()["message"]


async def test_run_ids_holding_a_slash_under_a_mount_point(engine: Engine, uid: str) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    @durably.workflow(f"{uid}.quick")
    async def quick(ctx: WorkflowCtx) -> int:
        return 1

    engine.register(quick)
    run_id = f"{uid}/a/b"
    await (await engine.start(quick, run_id=run_id)).result(timeout=10)
    host = Starlette(routes=[Mount("/ops/durable", app=create_app(engine))])
    async with client_for(host) as client:
        res = await client.get(f"/ops/durable/api/runs/{quote(run_id, safe='')}")
        assert res.status_code == 200, res.text
        assert res.json()["run"]["status"] == "completed"
