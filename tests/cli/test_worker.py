"""`durably worker APP` in one process; `durably start` / `durably runs …` in others."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.support import (
    cli_env,
    durably,
    json_of,
    ok,
    run_status,
    wait_for_status,
    wait_until,
    write_app,
)


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    out: Path
    err: Path

    def logs(self) -> str:
        return (
            f"stdout:\n{self.out.read_text(errors='replace')}\n"
            f"stderr:\n{self.err.read_text(errors='replace')}"
        )

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
            raise AssertionError(f"the worker ignored SIGTERM\n{self.logs()}") from None


def start_worker(tmp_path: Path, name: str = "worker") -> Worker:
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "durably._cli.main", "worker", "app:engine", "--steps"],
            cwd=tmp_path,
            env=cli_env(),
            stdout=stdout,
            stderr=stderr,
        )
    worker = Worker(process, out, err)

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the worker exited with {process.returncode}\n{worker.logs()}")
        return "ready" in err.read_text(errors="replace")

    wait_until(ready, timeout=20, what="the worker to be ready")
    return worker


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    store = write_app(tmp_path)
    yield tmp_path, store


@pytest.fixture
def worker(app: tuple[Path, str]) -> Iterator[Worker]:
    tmp_path, _ = app
    w = start_worker(tmp_path)
    try:
        yield w
    finally:
        if w.process.poll() is None:
            w.process.kill()
            w.process.wait(timeout=5)


def test_worker_executes_runs_started_elsewhere_and_exits_0_on_sigterm(
    app: tuple[Path, str], worker: Worker
) -> None:
    cwd, store = app
    run_id = ok(durably("start", "app:engine", "hello", "--input", '"ann"', cwd=cwd)).stdout.strip()
    done = wait_for_status(cwd, store, run_id, ("completed", "failed"), timeout=20)
    assert done["run"]["status"] == "completed", worker.logs()
    assert done["run"]["output"] == "hello ANN"
    assert worker.stop() == 0, worker.logs()
    logs = worker.logs()
    assert f"run.completed   {run_id}" in logs
    assert "drained" in logs


def test_signal_from_another_process_reaches_a_run_waiting_in_the_worker(
    app: tuple[Path, str], worker: Worker
) -> None:
    cwd, store = app
    ok(durably("start", "app:engine", "gated", "--input", '"bo"', "--run-id", "g1", cwd=cwd))
    waiting = wait_for_status(cwd, store, "g1", ("suspended",), timeout=20)
    assert waiting["waitingFor"] == ["go:bo"]
    human = ok(durably("runs", "show", "g1", "--store", store, cwd=cwd)).stdout
    assert "waiting for signal 'go:bo'" in human

    sent = json_of(
        durably(
            "runs",
            "signal",
            "go:bo",
            "--payload",
            '{"approved": true}',
            "--store",
            store,
            "--json",
            cwd=cwd,
        )
    )
    assert sent["delivered"] is True
    done = wait_for_status(cwd, store, "g1", ("completed", "failed"), timeout=20)
    output = done["run"]["output"]
    assert output["payload"] == {"approved": True}
    assert output["pid"] == worker.process.pid, "the worker, not the CLI, ran the body"
    assert worker.stop() == 0, worker.logs()


def test_retry_and_continue_are_executed_by_the_worker(
    app: tuple[Path, str], worker: Worker
) -> None:
    cwd, store = app
    ok(durably("start", "app:engine", "flaky", "--input", "21", "--run-id", "f1", cwd=cwd))
    ok(durably("start", "app:engine", "paused", "--run-id", "p1", cwd=cwd))
    failed = wait_for_status(cwd, store, "f1", ("failed", "completed"), timeout=20)
    assert failed["run"]["status"] == "failed", worker.logs()

    (cwd / "fixed").write_text("")
    retried = json_of(durably("runs", "retry", "f1", "--store", store, "--json", cwd=cwd))
    assert retried["status"] == "pending"
    done = wait_for_status(cwd, store, "f1", ("completed", "failed"), timeout=20)
    assert done["run"]["status"] == "completed", worker.logs()
    assert done["run"]["output"] == 42

    wait_for_status(cwd, store, "p1", ("suspended",), timeout=20)
    ok(durably("runs", "continue", "p1", "--store", store, cwd=cwd))
    past = wait_for_status(cwd, store, "p1", ("completed", "failed"), timeout=20)
    assert past["run"]["output"] == "past the breakpoint", worker.logs()
    assert run_status(cwd, store, "p1")["run"]["status"] == "completed"
    assert worker.stop(signal.SIGINT) == 0, worker.logs()  # Ctrl-C drains too
    assert "received SIGINT" in worker.logs()


def test_worker_refuses_a_non_driving_engine(tmp_path: Path) -> None:
    (tmp_path / "replica.py").write_text(
        f"import durably\nengine = durably.Engine('sqlite:///{tmp_path / 'r.db'}', drive=False)\n"
    )
    result = durably("worker", "replica:engine", cwd=tmp_path, timeout=30)
    assert result.returncode == 1
    assert "drive=False" in result.stderr
