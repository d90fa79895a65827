"""`durably runs prune` (real console script in subprocesses, a SQLite file in tmp_path):
a dry run counts, a prune deletes the old finished runs only, and bad input is refused."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import durably
from durably import WorkflowRun
from tests.cli.support import durably as cli
from tests.cli.support import json_of, ok, sqlite_url


def _seed(url: str) -> None:
    async def go() -> None:
        async with durably.Engine(url, workflows=[], drive=False) as engine:
            now = datetime.now(UTC)
            for run_id, status, days in (
                ("old-1", "completed", 40),
                ("old-2", "failed", 40),
                ("old-3", "running", 40),
                ("new-1", "completed", 0),
            ):
                when = now - timedelta(days=days)
                await engine.store.create_run(
                    WorkflowRun(
                        id=run_id,
                        workflow="report",
                        workflow_version="1",
                        status=status,  # type: ignore[arg-type]
                        created_at=when,
                        updated_at=when,
                    )
                )

    asyncio.run(go())


def _ids(url: str) -> set[str]:
    async def go() -> set[str]:
        async with durably.Engine(url, workflows=[], drive=False) as engine:
            return {r.id for r in await engine.store.list_runs(durably.RunQuery(limit=100))}

    return asyncio.run(go())


def test_dry_run_then_prune(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "p.db")
    _seed(url)
    args = ["runs", "prune", "--store", url, "--status", "completed", "--status", "failed"]
    dry = json_of(cli(*args, "--older-than", "30d", "--dry-run", "--json", cwd=tmp_path))
    assert dry == {"count": 2, "runIds": ["old-1", "old-2"], "dryRun": True}
    assert _ids(url) == {"old-1", "old-2", "old-3", "new-1"}
    refused = cli(*args, "--older-than", "30d", cwd=tmp_path, stdin="n\n")
    assert refused.returncode != 0 and _ids(url) == {"old-1", "old-2", "old-3", "new-1"}
    done = ok(cli(*args, "--older-than", "30d", "--yes", cwd=tmp_path))
    assert "2 run(s) deleted" in done.stdout
    assert _ids(url) == {"old-3", "new-1"}  # the live run and the fresh one stay


def test_bad_input_is_refused(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "p.db")
    _seed(url)
    base = ["runs", "prune", "--store", url, "--yes"]
    for extra, problem in (
        (["--status", "running", "--older-than", "1d"], "not a terminal status"),
        (["--status", "completed"], "no bound"),
        (["--status", "completed", "--older-than", "soon"], "not a duration"),
    ):
        result = cli(*base, *extra, cwd=tmp_path)
        assert result.returncode != 0 and problem in result.stderr, result
    assert _ids(url) == {"old-1", "old-2", "old-3", "new-1"}
