"""`durably worker APP --metrics-port N`: a real worker process serves the Prometheus
exposition on its own port; the scrape parses and counts the runs it drove."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import durably
from tests.cli.support import cli_env, wait_until
from tests.observe import hostile_app
from tests.observe.hostile_app import CODE, NAME, STEP
from tests.observe.support import samples, value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_app(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    source = Path(hostile_app.__file__).read_text(encoding="utf-8")
    source += f"\n\nengine = durably.Engine({url!r}, workflows=WORKFLOWS, timer_poll_ms=20)\n"
    (tmp_path / "app.py").write_text(source, encoding="utf-8")
    return url


def _scrape(port: int) -> tuple[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as res:
        return res.headers["Content-Type"], res.read().decode()


async def _start_runs(url: str) -> None:
    async with durably.Client(url) as client:
        for x in (1, 2, -1):
            await client.start(NAME, x, run_id=f"r{x}")


def test_worker_serves_the_exposition_on_its_metrics_port(tmp_path: Path) -> None:
    url = _write_app(tmp_path)
    port = _free_port()
    err = tmp_path / "worker.err"
    with err.open("wb") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "durably._cli.main",
                "worker",
                "app:engine",
                "-q",
                "--metrics-port",
                str(port),
            ],
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:

        def ready() -> bool:
            assert process.poll() is None, err.read_text(errors="replace")
            return "ready" in err.read_text(errors="replace")

        wait_until(ready, timeout=30, what="the worker to be ready")
        assert f"metrics on http://127.0.0.1:{port}/metrics" in err.read_text()
        asyncio.run(_start_runs(url))

        def settled() -> str | None:
            _, text = _scrape(port)
            done = value(text, "durable_runs_completed_total", workflow=NAME)
            failed = value(text, "durable_runs_failed_total", workflow=NAME, code=CODE)
            # The gauges are read from the store on each scrape and the counters come from
            # the engine's events, which can run just ahead of the run's committed write:
            # wait until both agree.
            pending = value(text, "durable_runs", status="pending")
            return text if (done, failed, pending) == (2, 1, 0) else None

        text = wait_until(settled, timeout=30, what="the worker's counters")
        content_type, _ = _scrape(port)
        assert content_type.startswith("text/plain; version=0.0.4")
        samples(text)  # the library's parser reads every line back
        assert value(text, "durable_runs_started_total", workflow=NAME) == 3
        assert value(text, "durable_steps_completed_total", workflow=NAME, step=STEP) == 2
        failed = value(text, "durable_steps_failed_total", workflow=NAME, step=STEP, code=CODE)
        assert failed == 2
        step = {"workflow": NAME, "step": STEP}
        assert value(text, "durable_step_duration_seconds_count", **step) == 2
        assert value(text, "durable_runs", status="pending") == 0

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, err.read_text(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
    try:
        _scrape(port)
    except (urllib.error.URLError, ConnectionError):
        pass
    else:
        raise AssertionError("the metrics port still answers after the worker exited")


HIDE_PROMETHEUS = (
    "import sys; sys.modules['prometheus_client'] = None\n"
    "from durably._cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_without_the_extra_metrics_port_names_the_extra(tmp_path: Path) -> None:
    _write_app(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", HIDE_PROMETHEUS, "worker", "app:engine", "--metrics-port", "0"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'durably[prometheus]'" in done.stderr, done.stderr
    assert not (tmp_path / "w.db").exists()  # refused before the engine opened


def test_a_metrics_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    _write_app(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "durably._cli.main",
                "worker",
                "app:engine",
                "--metrics-port",
                str(port),
            ],
            cwd=tmp_path,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode != 0
    assert f"--metrics-port {port} on 127.0.0.1" in done.stderr, done.stderr
