"""A process that imports no workflow code drives runs through `durably.Client` while a
`durably worker APP` process executes them — on an SQLite file and on PostgreSQL.

The client script starts a run by name with a JSON input, signals it, reads its result, and
proves the workflow module was never imported (`sys.modules`). The worker is the real console
script on the app module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.cli.support import cli_env, sqlite_url
from tests.cli.test_worker import Worker, start_worker
from tests.pg_support import fresh_schema, schema_url

APP = """
import durably


@durably.workflow("orders.approve")
async def approve(ctx: durably.WorkflowCtx, order: dict) -> dict:
    decision = await ctx.wait_for_signal(f"approve:{order['id']}")
    return {"order": order["id"], "approved": decision["ok"], "by": decision["by"]}


engine = durably.Engine(STORE_URL, workflows=[approve], drain_timeout_ms=5000)
"""

CLIENT = """
import asyncio
import json
import sys

import durably


async def main(url: str) -> None:
    async with durably.Client(url) as client:
        handle = await client.start("orders.approve", {"id": "o-7", "qty": 2}, run_id="o-7")
        for _ in range(400):  # the worker reaches the wait within a moment
            run = await client.get_run("o-7")
            if run is not None and run.status == "suspended":
                break
            await asyncio.sleep(0.05)
        sent = await client.signal("approve:o-7", {"ok": True, "by": "ann"})
        result = await handle.result(timeout=30)
        run = await client.get_run("o-7")
    print(json.dumps({
        "result": result,
        "signalled": sent.run_id if sent is not None else None,
        "status": run.status,
        "version": run.workflow_version,
        "app_imported": "app" in sys.modules,
        "workflow_modules": sorted(
            name for name, module in sys.modules.items()
            if getattr(module, "__file__", None) and "orders" in name
        ),
    }))


asyncio.run(main(sys.argv[1]))
"""


def run_client(tmp_path: Path, url: str) -> dict[str, object]:
    """Run the client script from a directory WITHOUT the app module (it could not import it
    even by accident), and return what it printed."""
    elsewhere = tmp_path / "client"
    elsewhere.mkdir()
    script = elsewhere / "client.py"
    script.write_text(textwrap.dedent(CLIENT), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script), url],
        cwd=elsewhere,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def check(tmp_path: Path, url: str) -> None:
    (tmp_path / "app.py").write_text(
        textwrap.dedent(APP).replace("STORE_URL", repr(url)), encoding="utf-8"
    )
    worker: Worker = start_worker(tmp_path)
    try:
        out = run_client(tmp_path, url)
        assert out == {
            "result": {"order": "o-7", "approved": True, "by": "ann"},
            "signalled": "o-7",
            "status": "completed",
            "version": "1",  # the worker pinned its newest (only) version
            "app_imported": False,
            "workflow_modules": [],
        }, worker.logs()
        assert worker.stop() == 0, worker.logs()
        assert "run.completed   o-7" in worker.logs()
    finally:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait(timeout=5)


def test_client_process_without_workflow_code_on_sqlite(tmp_path: Path) -> None:
    check(tmp_path, sqlite_url(tmp_path / "app.db"))


@pytest.fixture
async def pg_store_url() -> AsyncIterator[str]:
    async with fresh_schema(create=False) as schema:
        yield schema_url(schema)


def test_client_process_without_workflow_code_on_postgres(
    tmp_path: Path, pg_store_url: str
) -> None:
    check(tmp_path, pg_store_url)
