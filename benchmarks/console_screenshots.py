"""Regenerate the console screenshots of docs/console.md: a run's waterfall and the run list's
runs-over-time chart, taken with Playwright in Debian's Chromium (`/usr/bin/chromium`).

It runs a small engine on a temporary SQLite file: one run with ten steps, a step that fails
once and then succeeds, a 200-member fan (three members fail), a sleep and a child; and, for
the chart, 400 finished runs spread over the last 24 hours, written with the store's bulk
`create_runs` (backdated rows: running that many runs through the engine would put them all
in the last minute). Prints one JSON line naming each PNG and its size. Usage::

    python benchmarks/console_screenshots.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import tempfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvicorn

import durably
from durably import Engine, FatalError, RetryPolicy, WorkflowCtx, WorkflowRun
from durably.dashboard import create_app

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]
VIEWPORT = {"width": 1200, "height": 900}
FAST: dict[str, Any] = {"timer_poll_ms": 20, "lease_ms": 2000, "drain_timeout_ms": 2000}
HISTORY = 400


class Transient(Exception):
    pass


@durably.step("shop.reserve")
def reserve(i: int) -> int:
    return i


_calls: list[int] = []


@durably.step("shop.charge", retry=RetryPolicy(max_attempts=3, backoff_ms=80))
def charge() -> str:
    _calls.append(1)
    if len(_calls) < 2:
        raise Transient("the bank timed out")
    return "charged"


@durably.step("shop.notify")
def notify(i: int) -> int:
    if i in (17, 90, 161):
        raise FatalError(f"mailbox {i} is full", code="MAILBOX_FULL")
    return i


@durably.workflow("shop.invoice")
async def invoice(ctx: WorkflowCtx, x: int) -> int:
    return await ctx.step(reserve, x)


@durably.workflow("shop.checkout")
async def checkout(ctx: WorkflowCtx, _: Any) -> int:
    for i in range(10):
        await ctx.step(reserve, i)
    await ctx.step(charge)
    await ctx.all_settled(notify, range(200))
    await ctx.sleep("250ms")
    return await ctx.child(invoice, 7, id="checkout-1-invoice")


def _history(now: datetime) -> list[WorkflowRun]:
    rng = random.Random(7)
    out = []
    for i in range(HISTORY):
        # more traffic in the afternoon, a burst of failures around 6 hours ago
        created = now - timedelta(minutes=rng.triangular(5, 24 * 60, 9 * 60))
        failed = abs((now - created).total_seconds() / 3600 - 6) < 1 and rng.random() < 0.5
        out.append(
            WorkflowRun(
                id=f"history-{i}",
                workflow="shop.checkout",
                workflow_version="1",
                status="failed" if failed or rng.random() < 0.05 else "completed",
                input=None,
                created_at=created,
                updated_at=created + timedelta(seconds=rng.uniform(1, 900)),
            )
        )
    return out


class _Server(uvicorn.Server):
    """uvicorn, saying when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


@contextlib.asynccontextmanager
async def _serve(app: Any) -> AsyncIterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.setblocking(False)
    server = _Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    ready = asyncio.create_task(server.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # it stopped before it listened: its error
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def main(out: Path) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    shots = {"waterfall": out / "console-waterfall.png", "chart": out / "console-runs-chart.png"}
    with tempfile.TemporaryDirectory() as tmp:
        async with Engine(f"sqlite:///{tmp}/shots.db", **FAST) as engine:
            await engine.store.create_runs(_history(datetime.now(UTC)))
            await engine.execute(checkout, None, run_id="checkout-1", timeout=60)
            async with _serve(create_app(engine)) as base, async_playwright() as pw:
                browser = await pw.chromium.launch(
                    executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
                )
                page = await browser.new_page(viewport=VIEWPORT)
                await page.goto(base + "runs/checkout-1")
                await page.wait_for_selector("[data-testid=wf-fan]")
                await page.get_by_test_id("waterfall-panel").screenshot(path=shots["waterfall"])
                await page.goto(base + "runs")
                await page.wait_for_selector("[data-testid=chart-bar]")
                await page.get_by_test_id("runs-chart").screenshot(path=shots["chart"])
                await browser.close()
    return {
        "benchmark": "console_screenshots",
        "files": [
            {"path": str(p.resolve().relative_to(ROOT)), "bytes": p.stat().st_size}
            for p in shots.values()
        ],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    target = parser.parse_args().out
    target.mkdir(parents=True, exist_ok=True)
    print(json.dumps(asyncio.run(main(target))))
