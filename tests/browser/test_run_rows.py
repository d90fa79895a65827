"""The run page's rows in a real browser: each row's Kind says what it is (an in-process step
is not "remote"), a 1 s sleep shows about a second, the deadline of a wait with a timeout is
hidden under its wait until "show engine rows" is ticked, and a finished run is deleted after
the confirm (a live run's Delete is disabled)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import durably
from durably import Engine, WorkflowCtx
from durably.dashboard import create_app

from .conftest import csp_watch, serve
from .test_console import FAST, TIMEOUT_MS, VIEWPORT


async def _cell(page: Any, seq: int, testid: str) -> str:
    row = page.locator(f"[data-testid=timeline-row][data-seq='{seq}']")
    text: str = await row.get_by_test_id(testid).inner_text()
    return text.strip()


async def test_row_kinds_durations_engine_rows_and_delete(
    browser: Any, shots: Path, tmp_path: Path
) -> None:
    @durably.step("rows.browser.double")
    def double(x: int) -> int:
        return 2 * x

    @durably.workflow("rows.browser.tour")
    async def tour(ctx: WorkflowCtx, x: int) -> int:
        a = await ctx.step(double, x)
        await ctx.local_step("add", lambda log: a + 1)
        await ctx.sleep("1s")
        await ctx.wait_for_signal("rows-approve", timeout="30s")
        return a

    @durably.workflow("rows.browser.paused")
    async def paused(ctx: WorkflowCtx, x: int) -> int:
        await ctx.breakpoint()
        return x

    async with Engine(f"sqlite:///{tmp_path / 'rows.db'}", **FAST) as engine:
        await engine.start(paused, 1, run_id="live-run")
        await engine.start(tour, 1, run_id="tour-run")
        await engine.signal("rows-approve", "yes")  # buffered until the wait takes it
        # terminal, not merely settled: a run still sleeping would be read before its last rows
        await engine.wait_for_run("tour-run", timeout=30, until="terminal")
        async with serve(create_app(engine)) as base:
            context = await browser.new_context(viewport=VIEWPORT)
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            violations = csp_watch(page)
            await page.goto(base + "#/runs/tour-run")
            await page.wait_for_selector("[data-testid=timeline-row][data-seq='4']")

            assert await _cell(page, 0, "step-kind") == "in-process step"
            assert await _cell(page, 1, "step-kind") == "local step"
            assert await _cell(page, 2, "step-kind") == "sleep"
            duration = await _cell(page, 2, "step-duration")
            # due - scheduled: the deadline is taken a moment before the row is stamped
            assert duration == "1.0 s" or (
                duration.endswith(" ms") and int(duration[:-3]) >= 990
            ), duration
            assert (await _cell(page, 4, "step-kind")).startswith("signal wait")
            assert await _cell(page, 4, "step-timeout") == "· timeout 30.0 s"
            # the wait's deadline (seq 3) is folded into the wait
            deadline = page.locator("[data-testid=timeline-row][data-seq='3']")
            assert await deadline.count() == 0
            assert (await page.get_by_test_id("engine-row-count").inner_text()) == "(1)"
            await page.screenshot(path=shots / "20-run-rows.png")

            await page.get_by_test_id("engine-rows-toggle").check()
            await deadline.wait_for()
            assert await _cell(page, 3, "step-kind") == "timeout of signal wait rows-approve"
            assert await deadline.get_attribute("data-engine") == "1"
            assert await _cell(page, 3, "step-status") == "not reached"
            await page.screenshot(path=shots / "21-run-rows-engine.png")

            # Delete → confirm: the run is gone and the page is back on the list
            await page.get_by_test_id("control-delete").click()
            dialog = page.get_by_test_id("confirm-dialog")
            await dialog.wait_for(state="visible")
            await page.get_by_test_id("confirm-button").click()
            await page.wait_for_url("**/runs")
            assert await engine.get_run("tour-run") is None

            # a live run cannot be deleted from its page
            await page.goto(base + "#/runs/live-run")
            await page.wait_for_selector("[data-testid=timeline-row]")
            assert await page.get_by_test_id("control-delete").is_disabled()
            await context.close()
        assert await engine.get_run("live-run") is not None
        assert violations == [], violations
