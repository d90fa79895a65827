"""The console's flow-control queues: `GET queues` (what the workers panel shows), the queue
series of `GET metrics`, and this engine's worker concurrency on `GET workers`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import durably
from durably import Engine, Queue, WorkflowCtx
from durably.dashboard import create_app
from tests.observe.support import samples, value

from .conftest import FAST, client_for, wait_until


async def test_no_queues_no_rows_and_no_series(engine: Engine) -> None:
    async with client_for(create_app(engine)) as client:
        assert (await client.get("/api/queues")).json() == []
        metrics = samples((await client.get("/api/metrics")).text)
        assert not [name for name, _ in metrics if name.startswith("durable_queue_")]
        res = await client.get("/api/queues?queue=x")
        assert res.status_code == 400 and "`queue`" in res.json()["message"]


async def test_a_full_queue_shows_its_holder_its_waiter_and_why(tmp_path: Path, uid: str) -> None:
    gate = asyncio.Event()

    @durably.step(f"{uid}.hold")
    async def hold(i: int) -> int:
        await gate.wait()
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, i: int) -> int:
        return await ctx.step(hold, i, queue="api")

    queues = [Queue("api", concurrency=1, rate=(100, "1m"), retry=0.05), Queue("idle")]
    async with Engine(
        f"sqlite:///{tmp_path / 'q.db'}", queues=queues, concurrency=4, **FAST
    ) as engine:
        async with client_for(create_app(engine)) as client:
            first = await engine.start(wf, 1, run_id=f"{uid}-1")
            second = await engine.start(wf, 2, run_id=f"{uid}-2")

            async def blocked() -> bool:
                rows = (await client.get("/api/queues")).json()
                return rows[0]["waiting"] == 1 and rows[0]["inFlight"] == 1

            await wait_until(blocked)
            api, idle = (await client.get("/api/queues")).json()
            assert {k: api[k] for k in ("queue", "backend", "concurrency", "rate", "blocked")} == {
                "queue": "api",
                "backend": "LocalAdmission",
                "concurrency": 1,
                "rate": {"limit": 100, "periodMs": 60_000},
                "blocked": "concurrency",
            }
            assert (api["admitted"], api["heldHere"], api["waitingHere"]) == (1, 1, 1)
            assert api["denied"] >= 1 and api["windowCount"] == 1
            assert (idle["queue"], idle["inFlight"], idle["blocked"]) == ("idle", 0, None)

            metrics = (await client.get("/api/metrics")).text
            assert value(metrics, "durable_queue_in_flight", queue="api") == 1
            assert value(metrics, "durable_queue_waiting", queue="api") == 1
            assert value(metrics, "durable_queue_admitted_total", queue="api") == 1
            assert value(metrics, "durable_queue_blocked", queue="api", reason="concurrency") == 1
            assert value(metrics, "durable_queue_blocked", queue="api", reason="rate") == 0
            assert value(metrics, "durable_queue_in_flight", queue="idle") == 0

            [group] = (await client.get("/api/workers")).json()
            [me] = group["liveWorkers"]
            assert me["status"]["concurrency"] == {"mode": "fixed", "limit": 4}
            assert me["status"]["inFlight"] == 1  # the step holding the queue's slot

            gate.set()
            assert await first.result(timeout=30) == 1
            assert await second.result(timeout=30) == 2
            [api, _] = (await client.get("/api/queues")).json()
            assert (api["inFlight"], api["waiting"], api["admitted"], api["blocked"]) == (
                0,
                0,
                2,
                None,
            )
