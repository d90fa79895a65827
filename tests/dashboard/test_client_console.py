"""The console over a `durably.Client` (a web tier that runs no worker): the run, signal and
operator panels work from the store while an Engine on the same SQLite file drives the runs;
the panels only a worker answers say so with a 501."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Client, Engine, FatalError, WorkflowCtx
from durably.dashboard import DashboardConfigError, create_app
from tests.observe.support import value

from .conftest import FAST, client_for, wait_status


async def test_a_console_over_a_client_reads_and_operates_runs_a_worker_drives(
    tmp_path: Path, uid: str
) -> None:
    attempts: dict[str, int] = {}

    @durably.step(f"{uid}.flaky")
    async def flaky(x: int) -> int:
        attempts["n"] = attempts.get("n", 0) + 1
        if attempts["n"] == 1:
            raise FatalError("first attempt fails")
        return x * 10

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(flaky, x)

    @durably.workflow(f"{uid}.waiter")
    async def waiter(ctx: WorkflowCtx) -> str:
        return str(await ctx.wait_for_signal(f"{uid}-hook"))

    url = f"sqlite:///{tmp_path / 'web.db'}"
    async with Engine(url, workflows=[wf, waiter], **FAST) as worker, Client(url) as web:
        app = create_app(web)
        rid = (await web.start(f"{uid}.wf", 4, run_id=f"{uid}-r")).run_id
        await wait_status(worker, rid, "failed")
        async with client_for(app) as http:
            rows = (await http.get("/api/runs")).json()
            assert [r["id"] for r in rows] == [rid]
            detail = (await http.get(f"/api/runs/{rid}")).json()
            assert detail["run"]["status"] == "failed"

            # retry through the client's console; the worker runs the failed step again
            assert (await http.post(f"/api/runs/{rid}/retry")).status_code == 200
            assert await web.result(rid, timeout=30) == 40

            # a webhook signal reaches a run the worker drives
            wid = (await web.start(f"{uid}.waiter", run_id=f"{uid}-w")).run_id
            await wait_status(worker, wid, "suspended")
            hook = await http.post(f"/api/webhooks/{uid}-hook", json="hi")
            assert hook.status_code == 200
            assert await web.result(wid, timeout=30) == "hi"

            metrics = (await http.get("/api/metrics")).text
            assert value(metrics, "durable_runs", status="pending") == 0
            # no event counters: this console's process runs no engine
            assert "durable_runs_started_total" not in metrics
            for path in ("/api/workers", "/api/workers/directory", "/api/queues"):
                refused = await http.get(path)
                assert refused.status_code == 501, path
                assert "needs a durably.Engine" in refused.json()["message"]
            update = await http.post(f"/api/runs/{wid}/updates/x", json=1)
            assert update.status_code == 501
            assert "needs a durably.Engine" in update.json()["message"]


async def test_the_same_panels_answer_over_an_engine(engine: Engine) -> None:
    async with client_for(create_app(engine)) as http:
        for path in ("/api/workers", "/api/workers/directory", "/api/queues"):
            assert (await http.get(path)).status_code == 200, path
        metrics = (await http.get("/api/metrics")).text
        assert value(metrics, "durable_runs", status="pending") == 0


@pytest.mark.parametrize("thing", [object(), "sqlite:///x.db", None])
def test_create_app_refuses_what_is_neither_a_client_nor_an_engine(thing: Any) -> None:
    with pytest.raises(DashboardConfigError, match=r"durably\.Client or durably\.Engine"):
        create_app(thing)
