"""`durably worker APP --role R`: the role reaches an app whose engine leaves `role=` out, a
role the app contradicts is refused, and the ready line names the role."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cli.support import cli_env, durably

APP = """
import durably
from durably.transports import InMemoryTransport

@durably.step("roles.cli.ping")
def ping(x: int) -> int:
    return x

engine = durably.Engine("memory", transport=InMemoryTransport(), steps=[ping]{extra})
"""


def _write(tmp_path: Path, extra: str = "") -> None:
    (tmp_path / "roleapp.py").write_text(APP.format(extra=extra))


def test_the_role_flag_reaches_the_app_and_is_announced(tmp_path: Path) -> None:
    _write(tmp_path)
    err = tmp_path / "err.txt"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "durably", "worker", "roleapp:engine", "--role", "worker"],
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 30
        while " ready: " not in err.read_text():
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        assert "ready: role worker" in err.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_role_the_app_contradicts_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, ', role="worker"')
    done = durably("worker", "roleapp:engine", "--role", "control", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "contradicts --role control" in done.stderr
    # a role that cannot hold with the app's own options fails the app's import, naming why
    _write(tmp_path)  # steps=[ping] given: a control plane serves no step
    done = durably("worker", "roleapp:engine", "--role", "control", cwd=tmp_path)
    assert done.returncode != 0 and "serves no step" in done.stderr, done.stderr
