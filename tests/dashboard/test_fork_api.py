"""`POST runs/:id/fork` over a real SQLite store: a same-origin request forks the failed run
from a step (the fork reuses the steps before it), through the same front door as every
other change — a cross-site request and a read-only console fork nothing."""

from __future__ import annotations

import pytest

import durably
from durably import Engine, WorkflowCtx
from durably.dashboard import create_app

from .conftest import client_for

JSON = {"Content-Type": "application/json"}
SAME_ORIGIN = {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin", **JSON}
CROSS_SITE = [
    {"Origin": "http://evil.example", **JSON},
    {"Sec-Fetch-Site": "cross-site", **JSON},
    {"Origin": "http://localhost", "Content-Type": "text/plain"},
]
BUGGY = {"on": True}


async def _failed(engine: Engine, uid: str, executed: list[int]) -> str:
    @durably.step(f"{uid}.work", retries=0)
    async def work(i: int) -> int:
        executed.append(i)
        if i == 2 and BUGGY["on"]:
            raise durably.FatalError("bug at step 2")
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, n: int) -> list[int]:
        return [await ctx.step(work, i) for i in range(n)]

    engine.register(wf)
    BUGGY["on"] = True
    run = await (await engine.start(wf, 4, run_id=f"{uid}-r")).wait(timeout=20)
    assert run.status == "failed"
    return run.id


async def test_a_same_origin_fork_executes_from_the_step(engine: Engine, uid: str) -> None:
    executed: list[int] = []
    run_id = await _failed(engine, uid, executed)
    BUGGY["on"] = False
    executed.clear()
    async with client_for(create_app(engine)) as client:
        res = await client.post(
            f"/api/runs/{run_id}/fork", json={"fromSeq": 2}, headers=SAME_ORIGIN
        )
        assert res.status_code == 200, res.text
        assert res.json() == {"runId": f"{run_id}~fork~2", "forkedFrom": run_id, "fromSeq": 2}
        assert await engine.result(f"{run_id}~fork~2", timeout=20) == [0, 1, 2, 3]
        assert executed == [2, 3]
        detail = (await client.get(f"/api/runs/{run_id}~fork~2")).json()
        assert f"forked-from:{run_id}@2" in str(detail)
        bad = await client.post(
            f"/api/runs/{run_id}/fork", json={"fromSeq": 9}, headers=SAME_ORIGIN
        )
        assert bad.status_code == 409 and "out of range" in bad.json()["message"]
        missing = await client.post(
            f"/api/runs/{uid}-no/fork", json={"fromSeq": 0}, headers=SAME_ORIGIN
        )
        assert missing.status_code == 404
        wrong = await client.post(f"/api/runs/{run_id}/fork", json={"from": 1}, headers=SAME_ORIGIN)
        assert wrong.status_code == 400
        refused = await client.post(
            f"/api/runs/{run_id}/fork", json={"fromSeq": 1, "input": "x"}, headers=SAME_ORIGIN
        )
        assert refused.status_code == 422
    assert (await engine.get_run(run_id)).status == "failed"  # type: ignore[union-attr]


@pytest.mark.parametrize("headers", CROSS_SITE, ids=lambda h: ",".join(h.values()))
async def test_a_cross_site_fork_forks_nothing(
    engine: Engine, uid: str, headers: dict[str, str]
) -> None:
    run_id = await _failed(engine, uid, [])
    async with client_for(create_app(engine)) as client:
        res = await client.post(
            f"/api/runs/{run_id}/fork", content='{"fromSeq": 1}', headers=headers
        )
    assert res.status_code in (403, 415), res.text
    assert await engine.get_run(f"{run_id}~fork~1") is None


async def test_a_read_only_console_forks_nothing(engine: Engine, uid: str) -> None:
    run_id = await _failed(engine, uid, [])
    async with client_for(create_app(engine, read_only=True)) as client:
        res = await client.post(
            f"/api/runs/{run_id}/fork", json={"fromSeq": 1}, headers=SAME_ORIGIN
        )
    assert res.status_code == 403 and "fork" in res.json()["message"]
    assert await engine.get_run(f"{run_id}~fork~1") is None
