"""The run page's waterfall, the run list's chart and pages by path, in Chromium.

1. A run of 10 steps, a step that fails once then succeeds, a 200-member fan, a sleep and a
   child: one lane per row in seq order, one bar per attempt (the failed one first), the fan
   ONE band with its members' counts, the sleep and the child as waits, the child linked.
2. A 40,000-member fan (run through the engine, about 5 s quiet): ONE band with its total,
   and no request for a page of its members is ever made.
3. Pages by path under a mount prefix: `/durable/runs/<id>` opened directly and after a
   reload, an old `#/runs/<id>` link redirected to its path, a run link pushed into the
   history (Back returns to the list), the list's chart counting the runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.routing import Mount

import durably
from durably import Engine, RetryPolicy, WorkflowCtx
from durably.dashboard import create_app

from .conftest import csp_watch, serve

FAST: dict[str, Any] = {
    "timer_poll_ms": 20,
    "lease_ms": 2000,
    "drain_timeout_ms": 2000,
    "reconcile_ms": 3000,
}
TIMEOUT_MS = 20_000
VIEWPORT = {"width": 1280, "height": 900}
FAN = 200
WIDE = 40_000


class Transient(Exception):
    pass


def _workflows(tag: str) -> Any:
    calls: list[int] = []

    @durably.step(f"{tag}.plain")
    def plain(i: int) -> int:
        return i

    @durably.step(f"{tag}.flaky", retry=RetryPolicy(max_attempts=3, backoff_ms=50))
    def flaky() -> str:
        calls.append(1)
        if len(calls) < 2:
            raise Transient("the bank timed out")
        return "ok"

    @durably.step(f"{tag}.member")
    def member(i: int) -> int:
        return i

    @durably.workflow(f"{tag}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(plain, x)

    @durably.workflow(f"{tag}.parent")
    async def parent(ctx: WorkflowCtx, _: Any) -> int:
        for i in range(10):
            await ctx.step(plain, i)
        await ctx.step(flaky)
        await ctx.all(member, range(FAN))
        await ctx.sleep("300ms")
        return await ctx.child(child, 7, id="wf-kid")

    return parent


async def _lanes(page: Any) -> list[dict[str, Any]]:
    return list(
        await page.evaluate(
            """() => [...document.querySelectorAll('[data-testid=wf-lane]')].map((l) => ({
                 seq: +l.dataset.seq,
                 bars: [...l.querySelectorAll('.wf-bar')].map((b) => ({
                   testid: b.dataset.testid, attempt: b.dataset.attempt, status: b.dataset.status,
                   total: b.dataset.total, x: b.getBoundingClientRect().x,
                   w: b.getBoundingClientRect().width })),
                 text: l.textContent }))"""
        )
    )


async def test_the_waterfall_of_steps_a_retry_a_fan_a_sleep_and_a_child(
    browser: Any, shots: Path, tmp_path: Path
) -> None:
    parent = _workflows("wf1")
    async with Engine(f"sqlite:///{tmp_path / 'wf.db'}", **FAST) as engine:
        assert await engine.execute(parent, None, run_id="wf-run", timeout=60) == 7
        async with serve(create_app(engine)) as base:
            context = await browser.new_context(viewport=VIEWPORT)
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            violations = csp_watch(page)
            asked: list[str] = []
            page.on("request", lambda r: asked.append(r.url))
            await page.goto(base + "runs/wf-run")
            await page.wait_for_selector("[data-testid=wf-fan]")
            lanes = await _lanes(page)
            await page.locator("[data-testid=waterfall-panel]").screenshot(
                path=shots / "30-waterfall.png"
            )
            # the child's link opens the child's page
            await page.get_by_test_id("wf-child-link").click()
            await page.wait_for_selector("[data-testid=run-id]:text('wf-kid')")
            assert page.url == base + "runs/wf-kid"
            await context.close()

    seqs = [lane["seq"] for lane in lanes]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    steps = [lane for lane in lanes if lane["bars"][0]["testid"] == "wf-bar"]
    # 10 plain steps with one bar each, the retried step with two (failed, then completed)
    assert [len(lane["bars"]) for lane in steps[:11]] == [1] * 10 + [2]
    retried = steps[10]["bars"]
    assert [(b["attempt"], b["status"]) for b in retried] == [("1", "failed"), ("2", "completed")]
    assert retried[0]["x"] <= retried[1]["x"]
    # a waterfall: each of the first 11 lanes starts no earlier than the one before
    starts = [lane["bars"][0]["x"] for lane in steps[:11]]
    assert starts == sorted(starts)
    fans = [lane for lane in lanes if lane["bars"][0]["testid"] == "wf-fan"]
    assert len(fans) == 1 and fans[0]["bars"][0]["total"] == str(FAN)
    assert f"completed {FAN}" in fans[0]["text"]
    waits = [lane for lane in lanes if lane["bars"][0]["testid"] == "wf-wait"]
    assert waits[0]["text"].split(" ", 1)[1].startswith("sleep · ")
    assert any("wf-kid" in w["text"] for w in waits)
    # order: the steps, then the fan, then the sleep, then the child
    order = [lanes.index(steps[10]), lanes.index(fans[0]), lanes.index(waits[0])]
    assert order == sorted(order)
    assert lanes.index(waits[-1]) == len(lanes) - 1 or "wf-kid" in lanes[-1]["text"]
    assert fans[0]["bars"][0]["x"] >= starts[-1]
    assert not [u for u in asked if "/fans/" in u], "the fan's members were fetched"
    assert violations == [], violations


async def test_a_40000_member_fan_is_one_band_and_its_members_are_never_fetched(
    browser: Any, shots: Path, tmp_path: Path
) -> None:
    @durably.step("wf2.member")
    def member(i: int) -> int:
        return i

    @durably.workflow("wf2.wide")
    async def wide(ctx: WorkflowCtx, n: int) -> int:
        return len(await ctx.all(member, range(n)))

    async with Engine(f"sqlite:///{tmp_path / 'wide.db'}", **FAST) as engine:
        assert await engine.execute(wide, WIDE, run_id="wide-wf", timeout=300) == WIDE
        async with serve(create_app(engine)) as base:
            context = await browser.new_context(viewport=VIEWPORT)
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            violations = csp_watch(page)
            asked: list[str] = []
            page.on("request", lambda r: asked.append(r.url))
            await page.goto(base + "runs/wide-wf")
            band = page.get_by_test_id("wf-fan")
            await band.wait_for()
            assert await band.count() == 1
            assert await band.get_attribute("data-total") == str(WIDE)
            counts = await page.get_by_test_id("wf-fan-counts").inner_text()
            assert f"completed {WIDE:,}" in counts, counts
            assert await page.get_by_test_id("wf-lane").count() < 5
            await page.locator("[data-testid=waterfall-panel]").screenshot(
                path=shots / "31-waterfall-40k.png"
            )
            await context.close()
    api = [u for u in asked if "/api/" in u]
    assert any("/api/runs/wide-wf?" in u for u in api), api
    assert not [u for u in api if "/fans/" in u], api
    assert violations == [], violations


async def test_pages_by_path_under_a_mount_and_the_runs_chart(
    browser: Any, shots: Path, tmp_path: Path
) -> None:
    @durably.workflow("wf3.echo")
    async def echo(ctx: WorkflowCtx, x: int) -> int:
        return x

    slashed = "orders/2024/17"
    async with Engine(f"sqlite:///{tmp_path / 'paths.db'}", **FAST) as engine:
        for run_id in ("p-1", "p-2", slashed):
            await engine.execute(echo, 1, run_id=run_id)
        host = Starlette(routes=[Mount("/durable", app=create_app(engine))])
        async with serve(host) as root:
            base = root + "durable/"
            context = await browser.new_context(viewport=VIEWPORT)
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            violations = csp_watch(page)

            # opened directly, then reloaded: the run's page both times
            await page.goto(base + "runs/p-1")
            await page.wait_for_selector("[data-testid=run-id]:text('p-1')")
            await page.reload()
            await page.wait_for_selector("[data-testid=run-id]:text('p-1')")
            # an id holding `/` is one encoded segment
            await page.goto(base + "runs/" + quote(slashed, safe=""))
            assert await page.get_by_test_id("run-id").inner_text() == slashed
            # an old hash link lands on the path form
            await page.goto(base + "#/runs/p-2")
            await page.wait_for_selector("[data-testid=run-id]:text('p-2')")
            assert page.url == base + "runs/p-2"

            # the list: its chart counts the three runs; a run link is pushed, Back returns
            await page.goto(base + "runs")
            chart = page.get_by_test_id("runs-chart")
            await page.wait_for_selector("[data-testid=runs-chart][data-started='3']")
            assert await chart.get_attribute("data-completed") == "3"
            assert await chart.get_attribute("data-failed") == "0"
            assert await page.locator("[data-testid=chart-bar]").count() >= 2
            await chart.screenshot(path=shots / "32-runs-chart.png")
            await page.evaluate("() => { window.__sameDocument = true; }")
            await page.locator(
                "[data-testid=run-row][data-run-id='p-1'] [data-testid=run-link]"
            ).click()
            await page.wait_for_selector("[data-testid=run-id]:text('p-1')")
            assert page.url == base + "runs/p-1"
            await page.go_back()
            await page.wait_for_selector("[data-testid=run-row][data-run-id='p-2']")
            assert page.url == base + "runs"
            assert await page.evaluate("() => window.__sameDocument === true")
            await context.close()
    assert violations == [], violations


async def test_a_long_run_draws_its_first_lanes_and_counts_the_rest(
    browser: Any, shots: Path, tmp_path: Path
) -> None:
    @durably.step("wf4.plain")
    def plain(i: int) -> int:
        return i

    @durably.workflow("wf4.long")
    async def long(ctx: WorkflowCtx, n: int) -> int:
        await ctx.wait_for_signal("wf4-approve", timeout="1h")
        for i in range(n):
            await ctx.step(plain, i)
        return n

    @durably.workflow("wf4.open")
    async def open_wait(ctx: WorkflowCtx, _: Any) -> Any:
        await ctx.step(plain, 0)
        return await ctx.wait_for_signal("wf4-never")

    steps = 160
    async with Engine(f"sqlite:///{tmp_path / 'long.db'}", **FAST) as engine:
        handle = await engine.start(long, steps, run_id="long-run")
        await engine.start(open_wait, None, run_id="open-run")
        async with serve(create_app(engine)) as base:
            context = await browser.new_context(viewport=VIEWPORT)
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            violations = csp_watch(page)
            # a wait without a timeout has no row until it ends: the suspended run's
            # waterfall ends with an open gap
            await page.goto(base + "runs/open-run")
            await page.wait_for_selector("[data-testid=status-badge][data-status=suspended]")
            open_lane = page.locator("[data-testid=wf-lane][data-seq=open]")
            assert "suspended · waiting" in await open_lane.inner_text()
            await page.goto(base + "runs/long-run")
            # still waiting: its deadline's lane says so, and for what
            waiting = page.locator("[data-testid=wf-lane][data-seq='0']")
            await waiting.wait_for()
            assert "signal wait wf4-approve · waiting" in await waiting.inner_text()
            while await engine.signal("wf4-approve", {"ok": True}, buffer=False) is None:
                await page.wait_for_timeout(50)  # the run has not reached its wait yet
            assert await handle.result(timeout=60) == steps
            # the page follows the run live: 150 lanes drawn, the rest counted
            await page.wait_for_selector("[data-testid=wf-more]")
            lanes = page.get_by_test_id("wf-lane")
            assert await lanes.count() == 150
            assert await page.get_by_test_id("waterfall").get_attribute("data-lanes") == str(
                steps + 1
            )
            more = await page.get_by_test_id("wf-more").inner_text()
            assert more.startswith(f"{steps + 1 - 150} more steps"), more
            # delivered: the wait's own row replaces its deadline's lane
            first = lanes.first
            assert await first.get_attribute("data-seq") == "1"
            assert "signal wf4-approve · " in await first.inner_text()
            await context.close()
    assert violations == [], violations
