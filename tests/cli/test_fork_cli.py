"""`durably runs fork` (real console script in a subprocess, an SQLite file in tmp_path): the
fork it writes is executed by a worker and reuses the original's steps; refusals exit 1 with
the reason."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import durably
from tests.cli.support import durably as cli
from tests.cli.support import json_of, sqlite_url

_ids = itertools.count()
BUGGY = {"on": True}
EXECUTED: list[int] = []


def _workflow() -> durably.Workflow[Any, Any]:
    uid = f"cf{next(_ids)}"

    @durably.step(f"{uid}.work", retries=0)
    async def work(i: int) -> int:
        EXECUTED.append(i)
        if i == 2 and BUGGY["on"]:
            raise durably.FatalError("bug at step 2")
        return i

    @durably.workflow(f"{uid}-wf")
    async def wf(ctx: durably.WorkflowCtx, n: int) -> list[int]:
        return [await ctx.step(work, i) for i in range(n)]

    return wf


def test_fork_from_the_cli_is_executed_from_the_step(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "f.db")
    wf = _workflow()
    BUGGY["on"] = True
    EXECUTED.clear()

    async def fail() -> None:
        async with durably.Engine(url, workflows=[wf]) as engine:
            run = await (await engine.start(wf, 4, run_id="orig")).wait(timeout=20)
            assert run.status == "failed"

    asyncio.run(fail())
    refused = cli("runs", "fork", "orig", "--from-seq", "9", "--store", url, cwd=tmp_path)
    assert refused.returncode == 1 and "out of range" in refused.stderr
    unknown = cli("runs", "fork", "nope", "--from-seq", "0", "--store", url, cwd=tmp_path)
    assert unknown.returncode == 1 and "not found" in unknown.stderr

    forked = json_of(
        cli("runs", "fork", "orig", "--from-seq", "2", "--store", url, "--json", cwd=tmp_path)
    )
    assert forked == {
        "runId": "orig~fork~2",
        "forkedFrom": "orig",
        "fromSeq": 2,
        "status": "pending",
    }
    BUGGY["on"] = False
    EXECUTED.clear()

    async def drive() -> Any:
        async with durably.Engine(url, workflows=[wf]) as engine:
            return await engine.result("orig~fork~2", timeout=20)

    assert asyncio.run(drive()) == [0, 1, 2, 3]
    assert EXECUTED == [2, 3]
    # Forking again to the same id returns the fork (now completed) and --wait sees it.
    again = json_of(
        cli(
            "runs",
            "fork",
            "orig",
            "--from-seq",
            "2",
            "--wait",
            "--store",
            url,
            "--json",
            cwd=tmp_path,
        )
    )
    assert again["runId"] == "orig~fork~2" and again["status"] == "completed"
