"""The console's webhook endpoint delivers only to a run waiting now, never to the engine's own
waits, and never plants a signal; operators list and purge buffered signals."""

from __future__ import annotations

from typing import Any

import pytest

import durably
from durably import Engine, WorkflowCtx
from durably.dashboard import create_app

from .conftest import client_for, wait_status, wait_until

JSON = {"Content-Type": "application/json"}


async def _parked(engine: Engine, run_id: str, token: str) -> None:
    async def check() -> bool:
        return any(w.run_id == run_id for w in await engine.store.list_signal_waiters(token))

    await wait_until(check)
    await wait_status(engine, run_id, "suspended")


async def test_a_forged_child_completion_is_refused(engine: Engine, uid: str) -> None:
    @durably.workflow(f"{uid}.kid")
    async def kid(ctx: WorkflowCtx, x: int) -> int:
        await ctx.sleep(600)
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.child(kid, x, id=f"{uid}-kid")

    await engine.start(parent, 1, run_id=f"{uid}-parent")
    await wait_status(engine, f"{uid}-kid", "suspended")
    await _parked(engine, f"{uid}-parent", f"child:{uid}-kid")
    async with client_for(create_app(engine)) as client:
        res = await client.post(
            f"/api/webhooks/child:{uid}-kid", json={"ok": True, "value": "FORGED"}
        )
        assert res.status_code == 400, res.text
        body = res.json()
        assert body["kind"] == "child-workflow completion" and "child" in body["message"]
    for run_id in (f"{uid}-parent", f"{uid}-kid"):
        run = await engine.get_run(run_id)
        assert run is not None and run.status == "suspended" and run.output is None
    assert await engine.count_buffered_signals(prefix="child:") == 0


@pytest.mark.parametrize(
    ("token", "kind"),
    [
        ("bp:r1:3", "breakpoint"),
        ("update:r1:approve", "workflow update"),
        ("event:ZXY=:e30=:r1%232", "named-event wait"),
        ("child:r1.onError.1", "onError handler completion"),
        ("task:r1:ship", "external-task completion"),
        ("timer:r1", "durable timer"),
    ],
)
async def test_every_engine_owned_token_is_refused_by_kind(
    engine: Engine, token: str, kind: str
) -> None:
    async with client_for(create_app(engine)) as client:
        res = await client.post(f"/api/webhooks/{token}", json={"ok": True})
        assert res.status_code == 400, res.text
        assert res.json()["kind"] == kind and kind in res.json()["message"]
    assert await engine.count_buffered_signals() == 0


async def test_a_breakpoint_cannot_be_released_through_the_webhook(
    engine: Engine, uid: str
) -> None:
    @durably.workflow(f"{uid}.paused")
    async def paused(ctx: WorkflowCtx, x: int) -> int:
        await ctx.breakpoint()
        return x

    await engine.start(paused, 1, run_id=f"{uid}-bp")
    await wait_status(engine, f"{uid}-bp", "suspended")
    waiters = [w for w in await engine.store.list_signal_waiters("bp:") if w.run_id == f"{uid}-bp"]
    assert waiters
    async with client_for(create_app(engine)) as client:
        res = await client.post(f"/api/webhooks/{waiters[0].token}", json=None)
        assert res.status_code == 400 and res.json()["kind"] == "breakpoint"
        assert (await client.post(f"/api/runs/{uid}-bp/continue")).status_code == 200
    await wait_status(engine, f"{uid}-bp", "completed")


async def test_a_webhook_nobody_waits_on_is_not_stored(engine: Engine, uid: str) -> None:
    @durably.workflow(f"{uid}.waiter")
    async def waiter(ctx: WorkflowCtx, token: str) -> Any:
        return await ctx.wait_for_signal(token)

    token = f"wh:{uid}-later"
    async with client_for(create_app(engine)) as client:
        res = await client.post(f"/api/webhooks/{token}", json={"planted": True})
        assert res.status_code == 404
        assert res.json()["message"].startswith(f"no run is waiting on webhook {token}")
        assert await engine.count_buffered_signals() == 0

        # a run that waits on it later does not find a planted value
        await engine.start(waiter, token, run_id=f"{uid}-late")
        await _parked(engine, f"{uid}-late", token)
        run = await engine.get_run(f"{uid}-late")
        assert run is not None and run.output is None

        # while it waits, the webhook delivers
        res = await client.post(f"/api/webhooks/{token}", json={"real": 1})
        assert res.status_code == 200 and res.json()["runId"] == f"{uid}-late"
    await wait_status(engine, f"{uid}-late", "completed")
    run = await engine.get_run(f"{uid}-late")
    assert run is not None and run.output == {"real": 1}


async def test_buffered_signals_are_listed_and_purged(engine: Engine, uid: str) -> None:
    for i in range(3):
        await engine.signal(f"approve:{uid}-{i}", {"i": i})
    await engine.signal(f"ship-{uid}", None)
    assert await engine.count_buffered_signals() == 4
    async with client_for(create_app(engine)) as client:
        page = (await client.get("/api/signals/buffered?limit=2")).json()
        assert page["total"] == 4 and page["limit"] == 2 and len(page["items"]) == 2
        assert set(page["items"][0]) >= {"token", "sizeBytes", "bufferedAt", "expiresAt"}
        assert "payload" not in page["items"][0]
        rest = (await client.get("/api/signals/buffered?limit=2&offset=2")).json()
        tokens = {i["token"] for i in page["items"] + rest["items"]}
        assert tokens == {f"approve:{uid}-{i}" for i in range(3)} | {f"ship-{uid}"}
        approve = (await client.get("/api/signals/buffered?prefix=approve:")).json()
        assert approve["total"] == 3
        for bad in ("limit=0", "limit=5000", "offset=x", "prefix=", "colour=red"):
            res = await client.get(f"/api/signals/buffered?{bad}")
            assert res.status_code == 400, bad

        purge = "/api/signals/buffered/purge"
        for body in ({}, {"token": ""}, {"what": 1}, {"all": "yes"}, [1]):
            res = await client.post(purge, json=body)
            assert res.status_code == 400, body
        res = await client.post(purge, json={"token": f"approve:{uid}-1", "prefix": "approve:"})
        assert res.status_code == 400 and "token" in res.json()["message"]
        assert await engine.count_buffered_signals() == 4

        res = await client.post(purge, json={"token": f"approve:{uid}-1"})
        assert res.json() == {"purged": 1}
        res = await client.post(purge, json={"prefix": "approve:"})
        assert res.json() == {"purged": 2}
        res = await client.post(purge, json={"expiredOnly": True})
        assert res.json() == {"purged": 0}
        assert (await client.get("/api/signals/buffered")).json()["total"] == 1
        cross = await client.post(purge, json={"all": True}, headers={"Origin": "http://evil"})
        assert cross.status_code == 403
        res = await client.post(purge, json={"all": True})
        assert res.json() == {"purged": 1}
    assert await engine.count_buffered_signals() == 0

    await engine.signal(f"ship-{uid}", None)
    async with client_for(create_app(engine, read_only=True)) as client:
        res = await client.post("/api/signals/buffered/purge", json={"all": True})
        assert res.status_code == 403 and "read-only" in res.json()["message"]
        assert (await client.get("/api/signals/buffered")).json()["total"] == 1
