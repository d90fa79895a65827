"""A poison pill: a step that SIGKILLs its own process on every attempt.

The test restarts the worker process each time it dies. Crash recovery takes the run back
`max_recovery_attempts` times; the next time it gives up: the run is `dead`, its parent
(waiting on it with ctx.child) is told it failed, and its dead-letter workflow ran once as
`dlq:poison`. On a real SQLite file, and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.kill_support import kill, store_url

APP = Path(__file__).with_name("dead_letter_app.py")
CAP = 2


def _life(url: str, log: Path) -> tuple[int, str, str]:
    """One life of the worker process: until it dies or gives up on the run."""
    proc = subprocess.Popen(
        [sys.executable, str(APP), url, str(log)],
        env={**os.environ, "DL_CAP": str(CAP)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        kill(proc)
    return proc.returncode, out, err


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_run_that_kills_its_process_every_time_ends_dead_and_dead_lettered(
    tmp_path: Path, kind: str
) -> None:
    log = tmp_path / "attempts.log"
    async with store_url(kind, tmp_path, "dead-letter") as url:
        kills = 0
        result = None
        for _attempt in range(CAP + 3):  # CAP+1 deaths, then the life that gives up
            returncode, out, err = await asyncio.to_thread(_life, url, log)
            if returncode == -signal.SIGKILL:
                kills += 1
                continue
            assert returncode == 0, err
            result = json.loads(out.strip().splitlines()[-1])
            break
        assert result is not None, f"the worker never gave up after {kills} kills"

    lines = log.read_text().splitlines()
    assert kills == CAP + 1  # the first attempt, then one per recovery
    assert lines.count("attempt") == CAP + 1
    assert lines.count("handled poison") == 1  # the dead-letter run ran once
    dead = result["dead"]
    assert dead["status"] == "dead" and dead["recoveryAttempts"] == CAP + 1
    assert dead["error"]["code"] == "max_recovery_attempts"
    assert dead["error"]["details"] == {"deadLetterRun": "dlq:poison"}
    assert result["dlq"]["status"] == "completed"
    assert result["dlq"]["workflow"] == "dlk.handler"
    assert result["dlq"]["input"] == {
        "deadRunId": "poison",
        "workflow": "dlk.poison",
        "input": 1,
        "error": {
            "message": f"run exceeded maxRecoveryAttempts ({CAP}) — moved to dead-letter",
            "code": "max_recovery_attempts",
        },
    }
    parent = result["parent"]
    assert parent["status"] == "completed"
    assert "maxRecoveryAttempts" in (parent["output"]["childFailed"] or "")
