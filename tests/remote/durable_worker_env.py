"""The published `durable-worker` SDK, installed unmodified from the package registry into a
virtualenv of its own, for interop tests.

The virtualenv is built once per machine under a cache folder (`DURABLY_TEST_CACHE`, else
`~/.cache/durably-tests`) and reused; a lock file keeps parallel test processes from building it
twice. Nothing of the SDK is vendored or patched: the tests run its own runners
(`run_db_worker`, `run_redis_worker`) in a subprocess with this interpreter.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

DURABLE_WORKER = "durable-worker[redis,postgres]==0.26.1"


def cache_dir() -> Path:
    root = os.environ.get("DURABLY_TEST_CACHE") or str(Path.home() / ".cache" / "durably-tests")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def durable_worker_python() -> Path:
    """The interpreter of a virtualenv holding `durable-worker` 0.26.1 (built if missing)."""
    venv = cache_dir() / "durable-worker-0.26.1"
    python = venv / "bin" / "python"
    done = venv / ".installed"
    with open(cache_dir() / "durable-worker.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", DURABLE_WORKER],
                check=True,
                timeout=600,
            )
            probe = subprocess.run(
                [str(python), "-c", "import durable_worker, bullmq, asyncpg; print('ok')"],
                capture_output=True,
                text=True,
                check=True,
            )
            assert probe.stdout.strip() == "ok", probe
            done.write_text(DURABLE_WORKER)
    return python
