"""The runs list in a real browser says why a parked run waits: a run whose workflow no worker
serves reads "waits on worker: <name> — no worker serves workflow '<name>'"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import durably
from durably import Client, Engine, WorkflowCtx
from durably.dashboard import create_app
from tests.engine_support import wait_until

from .conftest import csp_watch, serve
from .test_console import TIMEOUT_MS, VIEWPORT

POLL = {"timer_poll_ms": 50, "lease_ms": 2_000, "drain_timeout_ms": 2_000}


async def test_a_parked_run_says_no_worker_serves_its_workflow(
    browser: Any, shots: Path, tmp_path: Path
) -> None:
    @durably.workflow("unserved.browser.convert")
    async def convert(ctx: WorkflowCtx, n: int) -> int:
        return n

    url = f"sqlite:///{tmp_path / 'unserved.db'}"
    typo = "unserved.browser.convrt"
    async with Client(url) as client:
        # No worker beats yet, so the start by name is allowed; the worker then parks it.
        handle = await client.start(typo, 1, run_id="parked-run")
        async with Engine(store=url, workflows=[convert], **POLL) as engine:

            async def parked() -> bool:
                run = await client.get_run(handle.run_id)
                return run is not None and run.status == "blocked"

            await wait_until(parked, timeout=15)
            async with serve(create_app(engine)) as base:
                context = await browser.new_context(viewport=VIEWPORT)
                page = await context.new_page()
                page.set_default_timeout(TIMEOUT_MS)
                violations = csp_watch(page)
                await page.goto(base + "#/runs")
                waiting = page.get_by_test_id("run-waiting").first
                await waiting.wait_for()
                text = (await waiting.inner_text()).strip()
                await page.screenshot(path=str(shots / "unserved-waiting.png"))
                await context.close()
    assert text == f"waits on worker: {typo} — no worker serves workflow {typo!r}", text
    assert violations == []
