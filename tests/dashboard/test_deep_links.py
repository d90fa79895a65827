"""The console's pages by path: `<base>/runs/<id>`, `<base>/workers`, … serve the console's
shell (so a link opened directly or a refreshed page works), under a mount prefix and a
custom base path, behind the session check, with the console's security headers."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from durably import Engine
from durably.dashboard import create_app

from .conftest import client_for

PATHS = [
    "runs",
    "runs/",
    "runs/r-1",
    "runs/orders%2F2024%2F17",
    "runs/a/b/c",
    "workers",
    "signals",
    "schedules",
]


@pytest.mark.parametrize("path", PATHS)
async def test_every_page_path_serves_the_shell_under_the_mount(engine: Engine, path: str) -> None:
    host = Starlette(routes=[Mount("/durable", app=create_app(engine))])
    async with client_for(host) as client:
        res = await client.get(f"/durable/{path}")
    assert res.status_code == 200, res.text
    assert res.headers["content-type"] == "text/html; charset=utf-8"
    assert res.headers["cache-control"] == "no-store, must-revalidate"
    assert "default-src" in res.headers["content-security-policy"]
    # assets and the API are addressed from the mount, never relative to the page's path
    assert 'src="/durable/assets/app.js"' in res.text
    assert '"api": "/durable/api"' in res.text


async def test_a_custom_base_path_and_unknown_pages(engine: Engine) -> None:
    app = create_app(engine, base_path="/console", api_base_path="/v1")
    async with client_for(app) as client:
        assert (await client.get("/console/runs/r-1")).status_code == 200
        assert (await client.get("/runs/r-1")).status_code == 404  # outside the base
        assert (await client.get("/console/nothing-here")).status_code == 404
        assert (await client.post("/console/runs/r-1")).status_code == 405
        assert (await client.get("/v1/runs")).json() == []  # the API is still the API


async def test_page_paths_need_a_session_and_come_back_after_login(engine: Engine) -> None:
    def login(username: str, password: str) -> object:
        return {"id": username} if password == "pw" else None

    app = create_app(engine, auth={"secret": "s3cret-0123456789abcdef", "login": login})
    async with client_for(app) as client:
        res = await client.get("/runs/r-1")
        assert res.status_code == 302
        assert res.headers["location"] == "/login?returnTo=%2Fruns%2Fr-1"
        ok = await client.post(
            "/login", json={"username": "u", "password": "pw", "returnTo": "/runs/r-1"}
        )
        assert ok.json() == {"redirectTo": "/runs/r-1"}
        assert (await client.get("/runs/r-1")).status_code == 200
