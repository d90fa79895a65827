"""The run-detail page shows every failed attempt of a step: select the retried step's row
and its detail lists each attempt (number, time, code, message), oldest first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import durably
from durably import Engine, FatalError, RetryPolicy, RunFailedError, WorkflowCtx
from durably.dashboard import create_app

from .conftest import csp_watch, serve

FAST: dict[str, Any] = {"timer_poll_ms": 20, "lease_ms": 2000, "drain_timeout_ms": 2000}
TIMEOUT_MS = 15_000


class Transient(Exception):
    pass


async def test_the_step_detail_lists_every_attempt(
    browser: Any, shots: Path, tmp_path: Path
) -> None:
    calls: list[int] = []

    @durably.step("browser.attempts", retry=RetryPolicy(max_attempts=5))
    def flaky() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise Transient(f"timed out talking to the bank ({len(calls)})")
        raise FatalError("card declined", code="DECLINED")

    @durably.workflow("browser.attempts-wf")
    async def wf(ctx: WorkflowCtx, _: Any) -> None:
        await ctx.step(flaky)

    async with Engine(f"sqlite:///{tmp_path / 'attempts.db'}", **FAST) as engine:
        try:
            await engine.execute(wf, None, run_id="attempts-1", timeout=15)
        except RunFailedError:
            pass
        async with serve(create_app(engine)) as base:
            context = await browser.new_context()
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            violations = csp_watch(page)
            await page.goto(base + "#/runs/attempts-1")
            await page.locator("[data-testid=timeline-row][data-seq='0']").click()
            attempts = page.locator("[data-testid=step-detail] [data-testid=step-attempt]")
            await page.wait_for_function(
                "() => document.querySelectorAll('[data-testid=step-attempt]').length === 3"
            )
            texts = [await attempts.nth(i).inner_text() for i in range(3)]
            numbers = [await attempts.nth(i).get_attribute("data-attempt") for i in range(3)]
            await page.screenshot(path=shots / "attempts-step-detail.png", full_page=True)
            await context.close()
    assert numbers == ["1", "2", "3"]
    assert texts[0].startswith("#1 ") and "timed out talking to the bank (1)" in texts[0]
    assert "(2)" in texts[1]
    assert "DECLINED" in texts[2] and "card declined" in texts[2]
    assert violations == [], violations
