"""Run the real `durably` console script in subprocesses against SQLite files in tmp_path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[2] / "src")
CLI_TIMEOUT = 60.0


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("DURABLY_STORE", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def durably(
    *args: str,
    cwd: Path,
    timeout: float = CLI_TIMEOUT,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m durably._cli.main ARGS` in `cwd`; never hangs past `timeout`."""
    return subprocess.run(
        [sys.executable, "-m", "durably._cli.main", *args],
        cwd=cwd,
        env=cli_env(env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result


def json_of(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result).stdout)


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


APP_SOURCE = """
import os

import durably


@durably.step("greet.shout")
def shout(name: str) -> str:
    return name.upper()


@durably.workflow("hello")
async def hello(ctx: durably.WorkflowCtx, name: str) -> str:
    loud = await ctx.step(shout, name)
    return f"hello {loud}"


@durably.workflow("gated")
async def gated(ctx: durably.WorkflowCtx, name: str) -> dict:
    payload = await ctx.wait_for_signal(f"go:{name}")
    return {"name": name, "payload": payload, "pid": os.getpid()}


@durably.step("flaky.check", retries=1)
def check(x: int) -> int:
    if not os.path.exists(os.path.join(os.path.dirname(__file__), "fixed")):
        raise RuntimeError("broken until ./fixed exists")
    return x * 2


@durably.workflow("flaky")
async def flaky(ctx: durably.WorkflowCtx, x: int) -> int:
    return await ctx.step(check, x)


@durably.workflow("paused")
async def paused(ctx: durably.WorkflowCtx) -> str:
    await ctx.breakpoint("inspect")
    return "past the breakpoint"


engine = durably.Engine(
    STORE_URL, workflows=[hello, gated, flaky, paused], drain_timeout_ms=5000
)
"""


def write_app(tmp_path: Path, name: str = "app") -> str:
    """Write the test app module; returns its store URL."""
    url = sqlite_url(tmp_path / f"{name}.db")
    source = APP_SOURCE.replace("STORE_URL", repr(url))
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    return url


def wait_until(
    predicate: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.2, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}: {last!r}")


def run_status(cwd: Path, store: str, run_id: str) -> dict[str, Any]:
    result = durably("runs", "show", run_id, "--store", store, "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    shown: dict[str, Any] = json.loads(result.stdout)
    return shown


def wait_for_status(
    cwd: Path, store: str, run_id: str, statuses: tuple[str, ...], timeout: float = 20.0
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        shown = run_status(cwd, store, run_id)
        return shown if shown["run"]["status"] in statuses else None

    found: dict[str, Any] = wait_until(
        check, timeout=timeout, interval=0.1, what=f"run {run_id} to be {statuses}"
    )
    return found
