"""`durably dashboard APP_OR_STORE_URL --port N` in a subprocess, the message it gives
without the `dashboard` extra, and its refusal to expose the console without sign-in."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import durably
from durably import Engine, WorkflowCtx
from durably._cli.common import Args, CliError
from durably._cli.dashboard import console_options
from durably._cli.main import parse_args

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _one_run(url: str, uid: str) -> None:
    @durably.workflow(f"{uid}.hello")
    async def hello(ctx: WorkflowCtx, x: int) -> int:
        return x

    async with Engine(url) as engine:
        await engine.execute(hello, 1, run_id=f"{uid}-cli")


def test_dashboard_serves_the_list_of_a_sqlite_store(tmp_path: Path, uid: str) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    asyncio.run(_one_run(url, uid))

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "durably._cli.main", "dashboard", url, "--port", str(port)],
        env=_env(),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 15
        rows = None
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise AssertionError(f"dashboard exited: {proc.communicate()}")
                try:
                    res = client.get("/api/runs")
                except httpx.TransportError:
                    time.sleep(0.1)
                    continue
                rows = res.json()
                break
            assert rows is not None, "the dashboard never answered"
            assert [r["id"] for r in rows] == [f"{uid}-cli"]
            assert rows[0]["status"] == "completed" and "output" not in rows[0]
            page = client.get("/")
            assert page.status_code == 200 and "durable-config" in page.text
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert "durably dashboard for" in out, (out, err)


HIDE_ON_IMPORT = "import sys; sys.modules['starlette'] = None\nimport durably.dashboard"
HIDE_STARLETTE = (
    "import sys; sys.modules['starlette'] = None; sys.modules['uvicorn'] = None\n"
    "from durably._cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_without_the_extra_it_names_the_extra_to_install(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", HIDE_STARLETTE, "dashboard", "sqlite:///x.db", "--port", "1"],
        env=_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert "pip install 'durably[dashboard]'" in done.stderr, done.stderr
    assert not (tmp_path / "x.db").exists()

    imported = subprocess.run(
        [sys.executable, "-c", HIDE_ON_IMPORT],
        env=_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert imported.returncode != 0
    assert "pip install 'durably[dashboard]'" in imported.stderr


# ---------------------------------------------------------------------- exposure and sign-in


CLI = [sys.executable, "-m", "durably._cli.main", "dashboard"]
SIGN_IN = [
    "--auth-secret-env",
    "DASH_SECRET",
    "--auth-user-env",
    "DASH_USER",
    "--auth-password-env",
    "DASH_PASS",
    "--auth-token-env",
    "DASH_TOKEN",
]


def _args(*argv: str) -> Args:
    return parse_args(["dashboard", "sqlite:///x.db", *argv])


def test_beyond_loopback_without_sign_in_it_refuses_to_start(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "::", "192.168.1.10", "myhost.example"):
        done = subprocess.run(
            [*CLI, "sqlite:///x.db", "--host", host, "--port", str(_free_port())],
            env=_env(),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2, (host, done.stdout, done.stderr)
        assert "refusing to serve the console" in done.stderr and host in done.stderr
        assert "--insecure-no-auth" in done.stderr and "--auth-secret-env" in done.stderr
        assert not (tmp_path / "x.db").exists()  # refused before the store was touched


def test_console_options_from_the_command_line() -> None:
    env = {"SECRET": "s" * 32, "USER": "ops", "PASS": "hunter2", "TOKEN": "t0ken"}
    local = console_options(_args(), env)
    assert local.auth is None and local.sign_in == "none"
    assert local.allowed_hosts == ("localhost", "127.0.0.1", "[::1]")
    wide = console_options(_args("--host", "0.0.0.0", "--insecure-no-auth"), env)
    assert wide.auth is None and wide.allowed_hosts == ("localhost", "127.0.0.1", "[::1]")
    named = console_options(
        _args("--host", "10.0.0.5", "--insecure-no-auth", "--allowed-host", "ops.example.com"),
        env,
    )
    assert named.allowed_hosts[-2:] == ("10.0.0.5", "ops.example.com")
    assert console_options(_args("--host", "::1"), env).auth is None  # loopback v6

    full = console_options(
        _args(
            "--host",
            "0.0.0.0",
            "--auth-secret-env",
            "SECRET",
            "--auth-user-env",
            "USER",
            "--auth-password-env",
            "PASS",
            "--auth-token-env",
            "TOKEN",
            "--auth-ttl",
            "30min",
        ),
        env,
    )
    assert full.auth is not None and full.sign_in == "login form + token"
    assert full.auth["secret"] == "s" * 32 and full.auth["ttl"] == "30min"
    login = full.auth["login"]
    assert login("ops", "hunter2") == {"id": "ops", "name": "ops"}
    assert login("ops", "hunter3") is None and login("root", "hunter2") is None
    assert login("anyone", "t0ken") == {"id": "token", "name": "anyone"}
    session = full.auth["session"]
    assert session(_Req({"authorization": "Bearer t0ken"})) == {"id": "token"}
    assert session(_Req({"authorization": "Bearer nope"})) is None
    assert session(_Req({})) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--auth-user-env", "USER", "--auth-password-env", "PASS"], "needs --auth-secret-env"),
        (["--auth-secret-env", "SECRET"], "needs a way to sign in"),
        (["--auth-secret-env", "SECRET", "--auth-user-env", "USER"], "go together"),
        (["--auth-secret-env", "MISSING", "--auth-token-env", "TOKEN"], "MISSING"),
        (["--auth-secret-env", "SECRET", "--auth-token-env", "EMPTY"], "EMPTY"),
        (
            ["--auth-secret-env", "SECRET", "--auth-token-env", "TOKEN", "--insecure-no-auth"],
            "contradicts",
        ),
        (
            ["--auth-secret-env", "SECRET", "--auth-token-env", "TOKEN", "--auth-ttl", "30 mins!"],
            "30 mins!",
        ),
    ],
)
def test_an_incomplete_sign_in_setup_is_refused(argv: list[str], message: str) -> None:
    env = {
        "SECRET": "s3cret-0123456789abcdef",
        "USER": "ops",
        "PASS": "pw",
        "TOKEN": "t",
        "EMPTY": "",
    }
    with pytest.raises(CliError, match=re.escape(message)):
        console_options(_args(*argv), env)


class _Req:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


def test_a_served_console_with_sign_in(tmp_path: Path, uid: str) -> None:
    url = f"sqlite:///{tmp_path / 'auth.db'}"
    asyncio.run(_one_run(url, uid))
    port = _free_port()
    env = {**_env(), "DASH_SECRET": "x" * 32, "DASH_USER": "ops", "DASH_PASS": "pw"}
    env["DASH_TOKEN"] = "tok"
    proc = subprocess.Popen(
        [*CLI, url, "--port", str(port), *SIGN_IN],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            deadline = time.monotonic() + 15
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"dashboard exited: {proc.communicate()}")
                try:
                    denied = client.get("/api/runs")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the dashboard never answered"
                    time.sleep(0.1)
            assert denied.status_code == 401
            wrong = client.post("/login", json={"username": "ops", "password": "no"})
            assert wrong.status_code == 401
            ok = client.post("/login", json={"username": "ops", "password": "pw"})
            assert ok.status_code == 200
            rows = client.get("/api/runs").json()  # the client keeps the session cookie
            assert [r["id"] for r in rows] == [f"{uid}-cli"]
            client.cookies.clear()
            assert client.post("/session", headers={"Authorization": "Bearer x"}).status_code == 401
            minted = client.post("/session", headers={"Authorization": "Bearer tok"})
            assert minted.status_code == 204
            assert client.get("/api/runs").status_code == 200
            assert client.get("/api/runs", headers={"Host": "evil.example"}).status_code == 400
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert "sign-in: login form + token" in out, (out, err)
