"""The schedules page in a real browser: reached from the navigation, it lists a static
schedule read-only and a persisted one whose Pause (with a note), Unpause and Trigger buttons
change it after a confirm; a run it started links to the run's page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import durably
from durably import Engine, WorkflowCtx
from durably.dashboard import create_app
from tests.engine_support import wait_status

from .conftest import csp_watch, serve

FAST: dict[str, Any] = {"timer_poll_ms": 20, "lease_ms": 2000, "drain_timeout_ms": 2000}
TIMEOUT_MS = 15_000
HOUR = 3_600_000
WINDOW = 470_000 * HOUR
NOW = WINDOW + HOUR // 2  # a still clock: only the window `hourly` is created in fires


@durably.workflow("browser.sched.report")
async def report(ctx: WorkflowCtx, n: int) -> int:
    return n


async def test_the_schedules_page(browser: Any, shots: Path, tmp_path: Path) -> None:
    async with Engine(
        f"sqlite:///{tmp_path / 'sched.db'}",
        workflows=[report],
        clock=lambda: NOW,
        schedules=[durably.Schedule("yearly", report, 1, cron="0 0 1 1 *", paused=True)],
        **FAST,
    ) as engine:
        await engine.schedules.create(durably.Schedule("hourly", report, 3, every="1h"))
        await wait_status(engine, f"sched:hourly:{WINDOW}", "completed")
        async with serve(create_app(engine)) as base:
            context = await browser.new_context()
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            violations = csp_watch(page)
            await page.goto(base + "#/runs")
            await page.get_by_test_id("nav-schedules").click()
            static = page.locator("[data-testid=schedule-row][data-schedule-id=yearly]")
            hourly = page.locator("[data-testid=schedule-row][data-schedule-id=hourly]")
            await hourly.wait_for()
            assert await static.get_attribute("data-source") == "static"
            assert await static.get_by_test_id("schedule-read-only").count() == 1
            assert await static.locator("button").count() == 0
            assert "0 0 1 1 *" in await static.get_by_test_id("schedule-cadence").inner_text()
            assert await hourly.get_by_test_id("schedule-cadence").inner_text() == "every 1h"
            last = hourly.get_by_test_id("schedule-last-run")
            assert await last.get_attribute("data-run-id") == f"sched:hourly:{WINDOW}"

            await hourly.get_by_test_id("schedule-pause").click()
            await page.get_by_test_id("confirm-dialog").wait_for(state="visible")
            await page.get_by_test_id("confirm-json").fill('{"note": "db migration"}')
            await page.get_by_test_id("confirm-button").click()
            await page.wait_for_selector(
                "[data-testid=schedule-row][data-schedule-id=hourly][data-paused=true]"
            )
            assert await hourly.get_by_test_id("schedule-note").inner_text() == "db migration"
            described = await engine.schedules.describe("hourly")
            assert described.schedule.paused and described.note == "db migration"

            await hourly.get_by_test_id("schedule-unpause").click()
            await page.get_by_test_id("confirm-button").click()
            await page.wait_for_selector(
                "[data-testid=schedule-row][data-schedule-id=hourly][data-paused=false]"
            )

            await hourly.get_by_test_id("schedule-trigger").click()
            await page.get_by_test_id("confirm-button").click()
            manual = f"sched:hourly:manual:{NOW}"
            link = hourly.locator(f"[data-testid=schedule-recent-run][data-run-id='{manual}']")
            await link.wait_for()
            await page.screenshot(path=shots / "schedules.png", full_page=True)
            await link.click()
            await page.wait_for_selector(f"[data-testid=run-id]:text-is('{manual}')")
            await context.close()
            assert violations == []
        assert await engine.result(manual, timeout=15) == 3
