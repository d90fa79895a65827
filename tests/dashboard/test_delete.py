"""`DELETE runs/:id` over a real SQLite store: a finished run goes with its checkpoints and
child runs, through the same front door as every other change (same origin, JSON, read-only
mode, the session), and a run that is still live — or has a live child — is refused."""

from __future__ import annotations

from typing import Any

import pytest

import durably
from durably import Engine, WorkflowCtx
from durably.dashboard import create_app

from .conftest import client_for, wait_status

JSON = {"Content-Type": "application/json"}
SAME_ORIGIN = {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin", **JSON}
SECRET = "s3cret-0123456789abcdef"


def _workflows(uid: str) -> tuple[Any, Any, Any]:
    @durably.workflow(f"{uid}.kid")
    async def kid(ctx: WorkflowCtx, x: int) -> int:
        if x < 0:
            await ctx.sleep("10m")
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx, x: int) -> int:
        if x < 0:
            await ctx.start_child(kid, x)  # left sleeping: the parent finishes first
            return x
        result: int = await ctx.child(kid, x)
        return result

    @durably.workflow(f"{uid}.paused")
    async def paused(ctx: WorkflowCtx, x: int) -> int:
        await ctx.breakpoint()
        return x

    return kid, parent, paused


async def _finished_parent(engine: Engine, uid: str, name: str = "done") -> tuple[str, str]:
    _, parent, _ = _workflows(uid)
    run_id = f"{uid}-{name}"
    assert await engine.execute(parent, 3, run_id=run_id) == 3
    (child,) = await engine.get_run_children(run_id)
    return run_id, child


async def test_a_same_origin_delete_removes_the_run_and_its_children(
    engine: Engine, uid: str
) -> None:
    run_id, child = await _finished_parent(engine, uid)
    async with client_for(create_app(engine)) as client:
        res = await client.delete(f"/api/runs/{run_id}", headers=SAME_ORIGIN)
        assert res.status_code == 200, res.text
        assert res.json() == {"runId": run_id, "deleted": 2}
        assert (await client.get(f"/api/runs/{run_id}")).status_code == 404
        again = await client.delete(f"/api/runs/{run_id}", headers=SAME_ORIGIN)
        assert again.status_code == 404
        assert again.json()["message"] == f"run {run_id} not found"
    assert await engine.get_run(run_id) is None
    assert await engine.get_run(child) is None
    assert await engine.list_checkpoints(run_id) == []


CROSS_SITE = [
    {"Origin": "http://evil.example", **JSON},
    {"Origin": "http://localhost:9999", **JSON},
    {"Origin": "null", **JSON},
    {"Sec-Fetch-Site": "cross-site", **JSON},
    {"Sec-Fetch-Site": "same-site", **JSON},
    {"Origin": "http://localhost", "Content-Type": "text/plain"},
]


@pytest.mark.parametrize("headers", CROSS_SITE, ids=lambda h: ",".join(h.values()))
async def test_a_cross_site_delete_deletes_nothing(
    engine: Engine, uid: str, headers: dict[str, str]
) -> None:
    run_id, child = await _finished_parent(engine, uid)
    async with client_for(create_app(engine)) as client:
        res = await client.delete(f"/api/runs/{run_id}", headers=headers)
    assert res.status_code in (403, 415), res.text
    assert set(res.json()) == {"statusCode", "message", "error"}
    assert await engine.get_run(run_id) is not None
    assert await engine.get_run(child) is not None


async def test_read_only_and_signed_out_consoles_delete_nothing(engine: Engine, uid: str) -> None:
    run_id, _ = await _finished_parent(engine, uid)
    async with client_for(create_app(engine, read_only=True)) as client:
        res = await client.delete(f"/api/runs/{run_id}", headers=SAME_ORIGIN)
        assert res.status_code == 403
        assert "read-only" in res.json()["message"] and "delete" in res.json()["message"]
    signed = create_app(engine, auth={"secret": SECRET, "login": lambda u, p: None})
    async with client_for(signed) as client:
        res = await client.delete(f"/api/runs/{run_id}", headers=SAME_ORIGIN)
        assert res.status_code == 401  # no session: the API's guard answers first
    assert await engine.get_run(run_id) is not None


async def test_a_live_run_or_a_run_with_a_live_child_is_refused(engine: Engine, uid: str) -> None:
    _, parent, paused = _workflows(uid)
    live = f"{uid}-live"
    await engine.start(paused, 1, run_id=live)
    await wait_status(engine, live, "suspended")
    orphaning = f"{uid}-orphaning"
    assert await engine.execute(parent, -1, run_id=orphaning) == -1
    (sleeper,) = await engine.get_run_children(orphaning)
    await wait_status(engine, sleeper, "suspended")

    async with client_for(create_app(engine)) as client:
        res = await client.delete(f"/api/runs/{live}", headers=SAME_ORIGIN)
        assert res.status_code == 409
        body = res.json()
        assert body["status"] == "suspended"
        assert body["message"] == (
            f"run {live} is suspended: only a finished run (completed, failed, cancelled or "
            "dead) can be deleted — cancel it first."
        )
        res = await client.delete(f"/api/runs/{orphaning}", headers=SAME_ORIGIN)
        assert res.status_code == 409
        assert res.json()["childRunId"] == sleeper
        assert f"child run {sleeper} that is still suspended" in res.json()["message"]
        # a query parameter it does not take is refused, as on every route
        res = await client.delete(f"/api/runs/{live}?force=true", headers=SAME_ORIGIN)
        assert res.status_code == 400

        # once cancelled, both go
        await engine.cancel(live)
        await engine.cancel(sleeper)
        await wait_status(engine, live, "cancelled")
        await wait_status(engine, sleeper, "cancelled")
        res = await client.delete(f"/api/runs/{live}", headers=SAME_ORIGIN)
        assert res.status_code == 200 and res.json()["deleted"] == 1
        res = await client.delete(f"/api/runs/{orphaning}", headers=SAME_ORIGIN)
        assert res.status_code == 200 and res.json()["deleted"] == 2
    for run_id in (live, orphaning, sleeper):
        assert await engine.get_run(run_id) is None
