"""`durably dashboard APP_OR_STORE_URL --port N` in a subprocess, and the message it gives
without the `dashboard` extra."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

import durably
from durably import Engine, WorkflowCtx

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
