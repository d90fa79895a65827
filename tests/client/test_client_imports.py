"""A process that only uses `durably.Client` (a web tier) does not load the worker runtime.

`import durably` keeps the runtime that executes runs (the worker, the turn driver, the
poller, a run's ctx and execution) out until something asks for `durably.Engine`,
`durably.WorkflowCtx` or a fan outcome. Checked in a fresh interpreter, from the modules
`python -X importtime` reports as imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import durably

SRC = str(Path(durably.__file__).resolve().parent.parent)

# Sub-packages of the runtime that only a process executing runs needs.
WORKER_SIDE = (
    "durably._engine.engine",
    "durably._engine.worker",
    "durably._engine.run",
    "durably._engine.remote",
    "durably._engine.triggers",
)


def _imported(code: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    # Each line: "import time: <self us> | <cumulative us> | <indent><module>"
    return {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


def _worker_side(modules: set[str]) -> set[str]:
    return {m for m in modules if m.startswith(WORKER_SIDE)}


def test_client_alone_does_not_import_the_worker_runtime() -> None:
    modules = _imported("import durably; durably.Client; durably.workflow; durably.step")
    assert "durably._engine.client.client" in modules  # the probe sees what it should
    assert _worker_side(modules) == set()
    for part in ("worker.worker", "worker.turn_driver", "worker.poller", "run.ctx"):
        assert f"durably._engine.{part}" not in modules


def test_engine_is_loaded_on_first_use() -> None:
    modules = _imported("import durably; durably.Engine")
    assert {"durably._engine.worker.worker", "durably._engine.run.ctx"} <= modules


def test_lazy_names_are_the_runtime_classes() -> None:
    from durably._engine.engine import Engine
    from durably._engine.run.ctx import WorkflowCtx
    from durably._engine.run.fans import Fulfilled, Rejected, Settled

    assert durably.Engine is Engine
    assert durably.WorkflowCtx is WorkflowCtx
    assert (durably.Settled, durably.Fulfilled, durably.Rejected) == (Settled, Fulfilled, Rejected)
    assert {"Engine", "WorkflowCtx", "Settled"} <= set(dir(durably))


def test_unknown_name_is_an_attribute_error() -> None:
    try:
        durably.Engines  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "Engines" in str(exc)
    else:
        raise AssertionError("durably.Engines resolved")
