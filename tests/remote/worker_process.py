"""Worker subprocesses for the remote-step tests: a `durably worker` serving an app, or the
published `durable-worker` SDK running a script; each writes to a log file, never a pipe.

A pipe that nobody reads once the worker is up fills and blocks the worker mid-write, so the
output goes to a file the test reads for readiness and shows when something fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest

from tests.pg_support import services_required
from tests.remote.durable_worker_env import durable_worker_python

REPO = Path(__file__).resolve().parents[2]

__all__ = [
    "WorkerProcess",
    "durably_worker",
    "running_worker",
    "sdk_python",
    "sdk_script",
    "subprocess_env",
]


class WorkerProcess:
    """A started worker subprocess and the file its output goes to."""

    def __init__(self, args: Sequence[str], log_path: Path, *, cwd: Path, env: dict[str, str]):
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                list(args), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait_for_output(self, wanted: str, timeout: float) -> None:
        """Until `wanted` appears in the output (fails if the process exits or time runs out)."""
        deadline = time.monotonic() + timeout
        while wanted not in self.output():
            assert self.proc.poll() is None, f"the worker exited:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {wanted!r} from the worker:\n{self.output()}"
            time.sleep(0.02)

    def sigkill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM (a `durably worker` drains), SIGKILL after `grace` seconds."""
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.sigkill()


def subprocess_env(
    extra: dict[str, str] | None = None, path: Sequence[Path] = ()
) -> dict[str, str]:
    """This process's environment plus `extra`, with `path`, durably's sources and the
    repository (for `tests.…` modules) importable."""
    pythonpath = os.pathsep.join(str(p) for p in (*path, REPO / "src", REPO))
    return {**os.environ, "PYTHONPATH": pythonpath, **(extra or {})}


@contextmanager
def durably_worker(
    app: str,
    log_path: Path,
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    ready_timeout: float = 30.0,
) -> Iterator[WorkerProcess]:
    """`python -m durably worker -q APP` started in `cwd` (importable), ready when it says so;
    stopped (SIGTERM, then SIGKILL) on exit unless the test killed it already."""
    worker = WorkerProcess(
        [sys.executable, "-m", "durably", "worker", "-q", app],
        log_path,
        cwd=cwd,
        env=subprocess_env(env, [cwd]),
    )
    try:
        worker.wait_for_output(" ready: ", ready_timeout)
        yield worker
    finally:
        worker.stop()


def sdk_python() -> Path:
    """The interpreter holding durable-worker 0.26.1 (skipped, or failed under CI, when it
    cannot be installed)."""
    try:
        return durable_worker_python()
    except (subprocess.SubprocessError, OSError) as exc:
        message = f"cannot install durable-worker 0.26.1: {exc}"
        if services_required():
            pytest.fail(message)
        pytest.skip(message)


@contextmanager
def sdk_script(
    script: Path, args: Sequence[str], log_path: Path, *, ready: str = "ready"
) -> Iterator[WorkerProcess]:
    """The SDK's interpreter running `script` with `args`, ready once it printed `ready`;
    killed on exit (the SDK's runners have no drain worth waiting for)."""
    worker = WorkerProcess(
        [str(sdk_python()), str(script), *args], log_path, cwd=script.parent, env=dict(os.environ)
    )
    try:
        worker.wait_for_output(ready, 60)
        yield worker
    finally:
        if worker.proc.poll() is None:
            worker.sigkill()


@asynccontextmanager
async def running_worker(
    app: str,
    log_path: Path,
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    ready_timeout: float = 30.0,
) -> AsyncIterator[WorkerProcess]:
    """`durably_worker` for a test whose event loop runs an engine: the waits happen in a
    thread, so the engine goes on meanwhile."""
    worker = WorkerProcess(
        [sys.executable, "-m", "durably", "worker", "-q", app],
        log_path,
        cwd=cwd,
        env=subprocess_env(env, [cwd]),
    )
    try:
        await asyncio.to_thread(worker.wait_for_output, " ready: ", ready_timeout)
        yield worker
    finally:
        await asyncio.to_thread(worker.stop)
