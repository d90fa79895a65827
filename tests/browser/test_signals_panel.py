"""The buffered-signals panel in a real browser: signals sent before any run waited are
listed (token, size, times — never the payload) and purged after the console's confirm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from durably import Engine
from durably.dashboard import create_app

from .conftest import csp_watch, serve
from .test_console import FAST, TIMEOUT_MS, VIEWPORT


async def test_list_and_purge_buffered_signals(browser: Any, shots: Path, tmp_path: Path) -> None:
    async with Engine(f"sqlite:///{tmp_path / 'signals.db'}", **FAST) as engine:
        for i in range(3):
            await engine.signal(f"approve:order-{i}", {"secret": "never shown"})
        await engine.signal("ship-1", None)
        async with serve(create_app(engine)) as base:
            context = await browser.new_context(viewport=VIEWPORT)
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            violations = csp_watch(page)
            await page.goto(base + "#/runs")
            await page.get_by_test_id("nav-signals").click()
            await page.wait_for_selector("[data-testid=signals-count][data-total='4']")
            rows = page.get_by_test_id("signal-row")
            assert await rows.count() == 4
            assert "never shown" not in await page.get_by_test_id("signals").inner_text()

            # one token: its row's Purge → confirm
            row = page.locator("[data-testid=signal-row][data-token='approve:order-1']")
            await row.get_by_test_id("signal-purge").click()
            dialog = page.get_by_test_id("confirm-dialog")
            await dialog.wait_for(state="visible")
            await page.screenshot(path=shots / "10-purge-signal-confirm.png")
            await page.get_by_test_id("confirm-button").click()
            await dialog.wait_for(state="hidden")
            await page.wait_for_selector("[data-testid=signals-count][data-total='3']")
            assert await engine.count_buffered_signals() == 3

            # a prefix, then Purge all purges only what matches it
            await page.get_by_test_id("signals-prefix").fill("approve:")
            await page.get_by_test_id("signals-filter").click()
            await page.wait_for_selector("[data-testid=signals-count][data-total='2']")
            await page.get_by_test_id("signals-purge-all").click()
            await dialog.wait_for(state="visible")
            await page.get_by_test_id("confirm-cancel").click()  # cancel deletes nothing
            await dialog.wait_for(state="hidden")
            assert await engine.count_buffered_signals() == 3
            await page.get_by_test_id("signals-purge-all").click()
            await page.get_by_test_id("confirm-button").click()
            await page.wait_for_selector("[data-testid=no-signals]")
            await context.close()
        assert await engine.count_buffered_signals() == 1  # ship-1 is not under approve:
        assert violations == [], violations
