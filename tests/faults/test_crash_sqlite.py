"""Crash recovery on the embedded default (SQLite): SIGKILL inside a step.

A worker process drives N runs of a 10-step workflow on a SQLite file and is killed with
SIGKILL while every run is inside step 5. A second process on the same file recovers them.
Checked from the side-effect log (written before anything else in the step, with one
O_APPEND write that survives the kill) and from the store:

* every run completes with the right output (10);
* steps whose checkpoint had committed before the kill (1–4) ran exactly once;
* the interrupted step (5) ran at most twice; steps after it ran exactly once;
* no (run, step) pair is missing.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

APP = Path(__file__).with_name("crash_app.py")
RUNS = 20


def _spawn(db: Path, log: Path, mode: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(APP), str(db), str(log), mode, str(RUNS)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(log: Path) -> list[tuple[str, int]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        run, step = line.split()
        out.append((run, int(step)))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("same_instance", [False, True], ids=["new-instance", "same-instance"])
def test_sigkill_inside_a_step_then_recover(tmp_path: Path, same_instance: bool) -> None:
    db, log = tmp_path / "crash.db", tmp_path / "side-effects.log"
    first = _spawn(
        db,
        log,
        "start",
        {
            "CRASH_BLOCK_STEP": "5",
            "CRASH_INSTANCE_ID": "worker-a",
            "CRASH_LEASE_MS": "1500",
        },
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            in_step_5 = {run for run, step in _lines(log) if step == 5}
            if len(in_step_5) == RUNS:
                break
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            time.sleep(0.05)
        else:
            pytest.fail("the worker never had every run inside step 5")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    before_kill = collections.Counter(_lines(log))
    assert all(before_kill[(f"crash-{i}", s)] == 1 for i in range(RUNS) for s in range(1, 6))

    second = _spawn(
        db,
        log,
        "recover",
        {
            "CRASH_INSTANCE_ID": "worker-a" if same_instance else "worker-b",
            "CRASH_LEASE_MS": "1500",
        },
    )
    out, err = second.communicate(timeout=90)
    assert second.returncode == 0, err
    results = json.loads(out.strip().splitlines()[-1])

    counts = collections.Counter(_lines(log))
    checked_steps = 0
    for i in range(RUNS):
        run = f"crash-{i}"
        assert results[run] == {"status": "completed", "output": 10}, (run, results[run])
        for step in range(1, 11):
            n = counts[(run, step)]
            checked_steps += 1
            if step == 5:
                assert 1 <= n <= 2, (run, step, n)  # interrupted: at most twice
            else:
                assert n == 1, (run, step, n)  # committed (or later): exactly once
    print(
        f"checked {RUNS} runs and {checked_steps} steps; "
        f"{sum(1 for i in range(RUNS) if counts[(f'crash-{i}', 5)] == 2)} step-5 re-runs"
    )
