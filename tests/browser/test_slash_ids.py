"""A run whose id holds `/` in a real browser: the list links to it, its detail page loads
(the UI encodes the id as one path segment, the API routes on the segments as sent), the live
stream connects, and Cancel → confirm cancels exactly that run — not the run named by the id's
first segment."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import durably
from durably import Engine, WorkflowCtx
from durably.dashboard import create_app

from .conftest import csp_watch, serve

FAST: dict[str, Any] = {"timer_poll_ms": 20, "lease_ms": 2000, "drain_timeout_ms": 2000}
TIMEOUT_MS = 15_000


async def _wait_status(engine: Engine, run_id: str, status: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while True:
        run = await engine.get_run(run_id)
        if run is not None and run.status == status:
            return
        assert loop.time() < deadline, f"{run_id} never reached {status}: {run}"
        await asyncio.sleep(0.05)


async def test_a_run_id_holding_a_slash_in_the_browser(
    browser: Any, shots: Path, tmp_path: Path
) -> None:
    @durably.workflow("browser.slash")
    async def held(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_signal("browser-slash-go")

    slashed, first = "orders/2024/17", "orders"
    async with Engine(f"sqlite:///{tmp_path / 'slash.db'}", workflows=[held], **FAST) as engine:
        for run_id in (slashed, first):
            await engine.start(held, run_id=run_id)
            await _wait_status(engine, run_id, "suspended")
        async with serve(create_app(engine)) as base:
            context = await browser.new_context()
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            violations = csp_watch(page)
            await page.goto(base + "#/runs")
            await page.locator(
                f"[data-testid=run-row][data-run-id='{slashed}'] [data-testid=run-link]"
            ).click()
            badge = page.get_by_test_id("status-badge")
            await page.wait_for_selector("[data-testid=status-badge][data-status=suspended]")
            assert await page.get_by_test_id("run-id").inner_text() == slashed
            await page.wait_for_selector("[data-testid=live-indicator][data-state=live]")
            await page.get_by_test_id("control-cancel").click()
            dialog = page.get_by_test_id("confirm-dialog")
            await dialog.wait_for(state="visible")
            await page.get_by_test_id("confirm-button").click()
            await page.wait_for_selector("[data-testid=status-badge][data-status=cancelled]")
            assert await badge.inner_text() == "cancelled"
            await page.screenshot(path=shots / "slash-id-cancelled.png", full_page=True)
            await context.close()
            assert violations == []
        await _wait_status(engine, slashed, "cancelled")
        other = await engine.get_run(first)
        assert other is not None and other.status == "suspended"
