"""The workers panel in a real browser, over real Redis: a durably engine serving a step
(its own liveness and descriptor keys) and two workers of another SDK whose keys are written
the way such workers write them, announcing different onError routes for one workflow. The
panel lists every live worker with its SDK, what it serves and its load, and shows the
disagreement."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

import durably
from durably import Engine
from durably._core.handshake import (
    OnErrorRouteWire,
    SdkInfo,
    WorkerDescriptor,
    WorkflowRegistration,
    descriptor_hash,
    descriptor_to_json,
)
from durably.dashboard import create_app
from durably.transports import RedisTransport
from tests.remote import redis_support

from .conftest import csp_watch, serve
from .test_console import FAST, TIMEOUT_MS, VIEWPORT

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix


def _node_worker(instance: str, code: str) -> WorkerDescriptor:
    return WorkerDescriptor(
        instance_id=instance,
        runtime="node",
        sdk=SdkInfo("durable-worker-ts", "3.1.0"),
        capabilities=("saga", "signals"),
        workflows=("billing",),
        registrations=(
            WorkflowRegistration(
                name="billing",
                version="3",
                group="billing",
                on_error=(OnErrorRouteWire("billing.refund", code),),
            ),
        ),
        started_at=1,
    )


async def test_the_workers_panel_lists_live_workers_and_disagreements(
    browser: Any, shots: Path, redis_url: str, redis_prefix: str
) -> None:
    raw = aioredis.Redis.from_url(redis_url, decode_responses=True)
    for instance, code in (("node-a", "declined"), ("node-b", "expired")):
        d = _node_worker(instance, code)
        beat = {
            "ts": int(time.time() * 1000),
            "status": {
                "concurrency": {"mode": "adaptive", "limit": 5, "min": 1, "max": 10},
                "inFlight": 2,
            },
            "descriptorHash": descriptor_hash(d),
        }
        await raw.set(
            f"{redis_prefix}-worker-heartbeat:billing:{instance}", json.dumps(beat), ex=35
        )
        await raw.set(
            f"{redis_prefix}-worker-descriptor:billing:{instance}", descriptor_to_json(d), ex=35
        )
    await raw.aclose()

    @durably.step("panel.resize")
    async def resize(x: int) -> int:
        return x

    transport = RedisTransport(redis_url, prefix=redis_prefix, instance_id="durably-web")
    async with Engine(
        "memory", transport, role="worker", steps=[resize], capabilities=["gpu"], **FAST
    ) as engine:
        async with serve(create_app(engine)) as base:
            context = await browser.new_context(viewport=VIEWPORT)
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            violations = csp_watch(page)
            await page.goto(base + "#/workers")
            await page.wait_for_selector("[data-testid=worker-group][data-group='billing']")

            mine = page.locator("[data-testid=worker-row][data-instance='durably-web']")
            assert await mine.get_by_test_id("worker-sdk").inner_text() == "durably 0.1.0"
            serves = await mine.get_by_test_id("worker-serves").inner_text()
            assert "steps: panel.resize" in serves and "capabilities: gpu" in serves

            node = page.locator("[data-testid=worker-row][data-instance='node-a']")
            assert await node.get_by_test_id("worker-sdk").inner_text() == "durable-worker-ts 3.1.0"
            assert await node.get_by_test_id("worker-in-flight").inner_text() == "2 / 5"
            assert "workflows: billing" in await node.get_by_test_id("worker-serves").inner_text()

            announced = page.locator("[data-testid=announced-workflow][data-key='billing@3']")
            assert "declined → billing.refund | expired → billing.refund" in (
                await announced.inner_text()
            )
            disagreement = page.locator("[data-testid=disagreement][data-key='billing@3']")
            assert (await disagreement.inner_text()).startswith(
                "billing@3: the workers disagree on onError:"
            )
            detail = await page.get_by_test_id("directory-detail").inner_text()
            assert "the workers disagree on billing@3" in detail
            await page.screenshot(path=shots / "20-workers-panel.png", full_page=True)
            await context.close()
    assert violations == [], violations
