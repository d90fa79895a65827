"""A run's lineage on its page, in a real browser: a fork links to the run it was forked from
(with the step) and that run's page lists its forks; a dead run shows the `dead` status and
links to its dead-letter run, which links back."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import durably
from durably import Engine, WorkflowCtx, WorkflowRun
from durably.dashboard import create_app
from tests.engine_support import wait_status

from .conftest import csp_watch, serve

FAST: dict[str, Any] = {
    "timer_poll_ms": 20,
    "lease_ms": 2000,
    "drain_timeout_ms": 2000,
    "reconcile_ms": 50,  # finds the staged crashed owner at once
}
TIMEOUT_MS = 15_000
FIXED = {"on": False}


@durably.step("browser.lineage.render", retries=0)
async def render(n: int) -> int:
    if not FIXED["on"]:
        raise durably.FatalError("template bug")
    return n


@durably.workflow("browser.lineage.job")
async def job(ctx: WorkflowCtx, n: int) -> int:
    return await ctx.step(render, n)


@durably.workflow("browser.lineage.dead_letter")
async def dead_letter(ctx: WorkflowCtx, dead: dict[str, Any]) -> str:
    return "handled"


@durably.workflow("browser.lineage.poison", dead_letter=dead_letter)
async def poison(ctx: WorkflowCtx) -> None:
    return None


async def test_fork_and_dead_letter_lineage_link_both_ways(
    browser: Any, shots: Path, tmp_path: Path
) -> None:
    FIXED["on"] = False
    async with Engine(
        f"sqlite:///{tmp_path / 'lineage.db'}",
        workflows=[job, dead_letter, poison],
        max_recovery_attempts=1,
        **FAST,
    ) as engine:
        run = await (await engine.start(job, 3, run_id="lin-1")).wait(timeout=15)
        assert run.status == "failed"
        FIXED["on"] = True
        fork = await engine.fork("lin-1", from_seq=0)
        assert await fork.result(timeout=15) == 3
        now = datetime.now(UTC)
        await engine.store.create_run(
            WorkflowRun(
                id="lin-poison",
                workflow="browser.lineage.poison",
                workflow_version="1",
                status="running",
                created_at=now,
                updated_at=now,
                locked_by="crashed",
                locked_until=1,
                recovery_attempts=1,
            )
        )
        await wait_status(engine, "lin-poison", "dead")
        await wait_status(engine, "dlq:lin-poison", "completed")

        async with serve(create_app(engine)) as base:
            context = await browser.new_context()
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            violations = csp_watch(page)

            # the fork's page names its original and the step it was forked from
            await page.goto(base + "#/runs/" + fork.run_id)
            origin = page.locator("[data-testid=rel-forked-from]")
            await origin.wait_for()
            assert await origin.get_attribute("data-run-id") == "lin-1"
            assert (await page.get_by_test_id("fork-step").inner_text()).strip() == "at step #0"
            await origin.click()
            # … and the original's page lists its forks
            await page.wait_for_selector("[data-testid=run-id]:text-is('lin-1')")
            back = page.locator("[data-testid=rel-fork]")
            await back.wait_for()
            assert await back.get_attribute("data-run-id") == fork.run_id
            assert await page.locator("[data-testid=rel-forked-from]").count() == 0
            await page.screenshot(path=shots / "lineage-forks.png", full_page=True)

            # a dead run: its status, and its dead-letter run both ways
            await page.goto(base + "#/runs/lin-poison")
            await page.wait_for_selector("[data-testid=status-badge][data-status=dead]")
            assert await page.get_by_test_id("status-badge").inner_text() == "dead"
            handler = page.locator("[data-testid=rel-dead-letter]")
            await handler.wait_for()
            assert await handler.get_attribute("data-run-id") == "dlq:lin-poison"
            await handler.click()
            await page.wait_for_selector("[data-testid=run-id]:text-is('dlq:lin-poison')")
            handled = page.locator("[data-testid=rel-dead-run]")
            await handled.wait_for()
            assert await handled.get_attribute("data-run-id") == "lin-poison"
            await page.screenshot(path=shots / "lineage-dead-letter.png", full_page=True)
            await context.close()
            assert violations == []
