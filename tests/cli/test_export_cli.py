"""`durably runs export` (real console script in a subprocess, an SQLite file in tmp_path):
the history it prints or writes is the engine's `export_history` and loads back; an unknown
run and an unwritable file exit 1 with the reason."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import durably
from durably.testing import Replayer, load_history
from tests.cli.support import durably as cli
from tests.cli.support import sqlite_url


def _workflow() -> durably.Workflow[Any, Any]:
    @durably.step("cli-export.double")
    async def double(i: int) -> int:
        return i * 2

    @durably.workflow("cli-export-wf")
    async def wf(ctx: durably.WorkflowCtx, n: int) -> list[int]:
        return [await ctx.step(double, i) for i in range(n)]

    return wf


def test_runs_export_prints_and_writes_the_history(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "e.db")
    wf = _workflow()

    async def record() -> dict[str, Any]:
        async with durably.Engine(url, workflows=[wf]) as engine:
            await engine.start(wf, 3, run_id="exp-1")
            await engine.wait_for_run("exp-1", timeout=20, until="terminal")
            return await engine.export_history("exp-1")

    expected = asyncio.run(record())
    printed = cli("runs", "export", "exp-1", "--store", url, cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == expected

    target = tmp_path / "exp-1.json"
    written = cli("runs", "export", "exp-1", "-o", str(target), "--store", url, cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert "3 checkpoints, completed" in written.stdout and str(target) in written.stdout
    assert json.loads(target.read_text()) == expected
    assert load_history(target).run.id == "exp-1"
    assert Replayer(workflows=[_workflow()]).replay_sync(target).output == [0, 2, 4]

    unknown = cli("runs", "export", "nope", "--store", url, cwd=tmp_path)
    assert unknown.returncode == 1 and "'nope' not found" in unknown.stderr
    blocked = cli(
        "runs",
        "export",
        "exp-1",
        "-o",
        str(tmp_path / "no" / "dir.json"),
        "--store",
        url,
        cwd=tmp_path,
    )
    assert blocked.returncode == 1 and "cannot write" in blocked.stderr
