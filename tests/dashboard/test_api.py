"""The console's JSON API against a real Engine on a SQLite file."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import pytest

import durably
from durably import Engine, FatalError, WorkflowCtx
from durably.dashboard import create_app
from tests.observe.support import value

from .conftest import client_for, wait_status, wait_until

WIDE = 5_000
FAILING = {3, 2_500, 4_999}


async def test_list_filters_paging_facets_and_values(engine: Engine, uid: str) -> None:
    @durably.workflow(f"{uid}.echo")
    async def echo(ctx: WorkflowCtx, x: int) -> int:
        if x >= 4:
            await ctx.breakpoint()
        return x

    for i in range(6):
        await engine.start(
            echo,
            i,
            run_id=f"{uid}-{i}",
            tags=["a" if i % 2 else "b"],
            search_attributes={"amount": i * 100},
        )
    for i in range(6):
        await wait_status(engine, f"{uid}-{i}", "completed" if i < 4 else "suspended")

    async with client_for(create_app(engine)) as client:
        rows = (await client.get("/api/runs")).json()
        assert sorted(r["id"] for r in rows) == [f"{uid}-{i}" for i in range(6)]
        assert all(not {"input", "output", "error"} & set(r) for r in rows)
        assert {r["status"] for r in rows} == {"completed", "suspended"}

        tagged = (await client.get("/api/runs", params={"tag": "a"})).json()
        assert sorted(r["id"] for r in tagged) == [f"{uid}-{i}" for i in (1, 3, 5)]
        page = (await client.get("/api/runs?limit=2&offset=1")).json()
        assert len(page) == 2
        assert (await client.get("/api/runs?limit=-1&offset=abc")).status_code == 400
        rich = (await client.get("/api/runs?attr=amount:gte:300&attr=")).json()
        assert sorted(r["id"] for r in rich) == [f"{uid}-{i}" for i in (3, 4, 5)]
        both = (await client.get("/api/runs?status=completed&status=suspended&tag=b")).json()
        assert len(both) == 3
        waiting = (await client.get("/api/runs?status=suspended")).json()
        assert {r["id"] for r in waiting} == {f"{uid}-4", f"{uid}-5"}
        assert all(r["waiting"] == {"on": "breakpoint", "name": "breakpoint"} for r in waiting)

        # facets: whole-set counts, status/origin/page dropped
        facets = (await client.get("/api/runs/facets?status=completed&limit=1&tag=a")).json()
        assert sorted((f["status"], f["origin"], f["count"]) for f in facets) == [
            ("completed", None, 2),
            ("suspended", None, 1),
        ]
        everything = (await client.get("/api/runs/facets")).json()
        assert sum(f["count"] for f in everything) == 6

        values = (await client.get("/api/runs/values?field=tag&tag=a")).json()
        assert sorted((v["value"], v["count"]) for v in values) == [("a", 3), ("b", 3)]
        amounts = (await client.get("/api/runs/values?field=attr.amount&limit=2")).json()
        assert len(amounts) == 2 and all(v["count"] == 1 for v in amounts)
        bad = await client.get("/api/runs/values?field=nope")
        assert bad.status_code == 400
        assert set(bad.json()) == {"statusCode", "message", "error"}

        missing = await client.get(f"/api/runs/{uid}-nope")
        assert missing.status_code == 404
        assert missing.json() == {
            "statusCode": 404,
            "message": f"run {uid}-nope not found",
            "error": "Not Found",
        }
        full = (await client.get(f"/api/runs/{uid}-1")).json()
        assert full["run"]["input"] == 1 and full["run"]["output"] == 1
        assert "fans" not in full and "etag" not in full

        workers = await client.get("/api/workers")
        assert workers.status_code == 200 and isinstance(workers.json(), list)
        assert (await client.get("/api/topology")).json() == {"role": "control-plane"}
        assert (await client.get("/api/nothing")).status_code == 404


async def test_detail_of_a_5000_member_fan_etags_and_fan_pages(engine: Engine, uid: str) -> None:
    @durably.step(f"{uid}.work")
    def work(x: int) -> int:
        if x in FAILING:
            raise FatalError(f"member {x} failed", code="BAD")
        return x

    @durably.workflow(f"{uid}.wide")
    async def wide(ctx: WorkflowCtx, n: int) -> int:
        settled = await ctx.all_settled(work, range(n))
        return sum(1 for s in settled if s.status == "rejected")

    run_id = f"{uid}-wide"
    began = time.perf_counter()
    assert await engine.execute(wide, WIDE, run_id=run_id) == len(FAILING)
    built = time.perf_counter() - began

    async with client_for(create_app(engine)) as client:
        began = time.perf_counter()
        res = await client.get(f"/api/runs/{run_id}?summarizeFansOver=100")
        took = time.perf_counter() - began
        assert res.status_code == 200
        etag = res.headers["etag"]
        body = res.json()
        assert body["etag"] == etag and "notModified" not in body
        assert len(res.content) < 32 * 1024, len(res.content)
        assert len(body["fans"]) == 1
        fan = body["fans"][0]
        assert fan["size"] == WIDE and fan["total"] == WIDE
        assert fan["counts"] == {"completed": WIDE - len(FAILING), "failed": len(FAILING)}
        assert len(fan["failures"]) == len(FAILING)
        assert all(cp.get("parallelGroup") != fan["group"] for cp in body["timeline"])

        cached = await client.get(
            f"/api/runs/{run_id}?summarizeFansOver=100", headers={"If-None-Match": etag}
        )
        assert cached.status_code == 304 and cached.content == b""
        assert cached.headers["etag"] == etag
        star = await client.get(
            f"/api/runs/{run_id}?summarizeFansOver=100", headers={"If-None-Match": "*"}
        )
        assert star.status_code == 304
        other = await client.get(
            f"/api/runs/{run_id}?summarizeFansOver=50", headers={"If-None-Match": etag}
        )
        assert other.status_code == 200  # the threshold is an etag input
        plain = await client.get(f"/api/runs/{run_id}")
        assert plain.status_code == 200 and "fans" not in plain.json()

        group = quote(fan["group"], safe="")
        first = await client.get(f"/api/runs/{run_id}/fans/{group}?limit=50&offset=10")
        assert first.status_code == 200
        page = first.json()
        assert page["total"] == WIDE and len(page["items"]) == 50
        seqs = [cp["seq"] for cp in page["items"]]
        assert seqs == list(range(fan["firstSeq"] + 10, fan["firstSeq"] + 60))
        again = await client.get(
            f"/api/runs/{run_id}/fans/{group}?limit=50&offset=10",
            headers={"If-None-Match": first.headers["etag"]},
        )
        assert again.status_code == 304 and again.headers["etag"] == first.headers["etag"]
        failed = (await client.get(f"/api/runs/{run_id}/fans/{group}?failedOnly=true")).json()
        assert failed["total"] == len(FAILING)
        assert [cp["seq"] - fan["firstSeq"] for cp in failed["items"]] == sorted(FAILING)
        assert all(cp["error"]["code"] == "BAD" for cp in failed["items"])
        one = (await client.get(f"/api/runs/{run_id}/fans/{group}?failedOnly=1&limit=1")).json()
        assert one["total"] == len(FAILING) and len(one["items"]) == 1
        unknown = await client.get(f"/api/runs/{uid}-nope/fans/{group}")
        assert unknown.status_code == 404
    print(
        f"\n5,000-member fan built in {built:.1f}s; summarised detail {len(res.content)} B "
        f"in {took * 1000:.0f} ms"
    )


async def test_control_endpoints(engine: Engine, uid: str) -> None:
    flaky = {"fail": True}
    undone: list[str] = []

    @durably.step(f"{uid}.maybe")
    def maybe(x: int) -> int:
        if flaky["fail"]:
            raise FatalError("broken", code="BROKEN")
        return x * 10

    @durably.workflow(f"{uid}.fragile")
    async def fragile(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(maybe, x)

    @durably.workflow(f"{uid}.sleeper")
    async def sleeper(ctx: WorkflowCtx, x: int) -> int:
        await ctx.local_step("a", lambda log: x, compensate=lambda: undone.append("a"))
        await ctx.sleep(600)
        return x

    @durably.workflow(f"{uid}.paused")
    async def paused(ctx: WorkflowCtx, x: int) -> int:
        await ctx.breakpoint()
        return x + 1

    @durably.workflow(f"{uid}.waiter")
    async def waiter(ctx: WorkflowCtx, token: str) -> Any:
        return await ctx.wait_for_signal(token)

    async with client_for(create_app(engine)) as client:
        # retry a failed run and see it complete
        rid = f"{uid}-fragile"
        await engine.start(fragile, 4, run_id=rid)
        await wait_status(engine, rid, "failed")
        flaky["fail"] = False
        res = await client.post(f"/api/runs/{rid}/retry")
        assert res.status_code == 200
        await wait_status(engine, rid, "completed")
        assert (await client.get(f"/api/runs/{rid}")).json()["run"]["output"] == 40
        unknown = await client.post(f"/api/runs/{uid}-nope/retry")
        assert unknown.status_code == 404 and unknown.json()["message"].endswith("not found")

        # retry with input: a new run
        res = await client.post(f"/api/runs/{rid}/retry-with-input", json={"input": 7})
        assert res.status_code == 200
        new_id = res.json()["runId"]
        assert new_id.startswith(f"{rid}~retry~")
        await wait_status(engine, new_id, "completed")
        new_run = await engine.get_run(new_id)
        assert new_run is not None and new_run.output == 70
        bad = await client.post(
            f"/api/runs/{rid}/retry-with-input",
            content=b"{nope",
            headers={"Content-Type": "application/json"},
        )
        assert bad.status_code == 400
        gone = await client.post(f"/api/runs/{uid}-nope/retry-with-input", json={"input": 1})
        assert gone.status_code == 404

        # cancel, and cancel with compensation
        plain, undo = f"{uid}-plain", f"{uid}-undo"
        await engine.start(sleeper, 1, run_id=plain)
        await engine.start(sleeper, 2, run_id=undo)
        await wait_status(engine, plain, "suspended")
        await wait_status(engine, undo, "suspended")
        res = await client.post(f"/api/runs/{plain}/cancel?compensate=false")
        assert res.status_code == 200 and res.json()["status"] == "cancelled"
        assert undone == []
        res = await client.post(f"/api/runs/{undo}/cancel?compensate=true")
        assert res.status_code == 200
        assert res.json()["status"] in ("cancelling", "cancelled")
        await wait_status(engine, undo, "cancelled")
        await wait_until(lambda: _true(undone == ["a"]))
        res = await client.post(f"/api/runs/{uid}-nope/cancel")
        assert res.status_code == 404 and res.json()["message"] == f"run {uid}-nope not found"

        # continue a breakpoint
        bp = f"{uid}-bp"
        await engine.start(paused, 1, run_id=bp)
        await wait_status(engine, bp, "suspended")
        res = await client.post(f"/api/runs/{bp}/continue")
        assert res.status_code == 200 and res.json()["runId"] == bp
        await wait_status(engine, bp, "completed")
        res = await client.post(f"/api/runs/{bp}/continue")
        assert res.status_code == 404
        assert res.json()["message"] == f"run {bp} is not paused at a breakpoint"

        # redispatch
        res = await client.post(f"/api/runs/{bp}/redispatch")
        assert res.status_code == 200
        assert res.json() == {"runId": bp, "status": "completed", "redispatched": 0}
        assert (await client.post(f"/api/runs/{uid}-nope/redispatch")).status_code == 404

        # signal through the webhook endpoint
        token = f"wh:{uid}"
        sig = f"{uid}-sig"
        await engine.start(waiter, token, run_id=sig)

        async def parked() -> bool:
            waiters = await engine.store.list_signal_waiters(token)
            return any(w.run_id == sig for w in waiters)

        await wait_until(parked)
        await wait_status(engine, sig, "suspended")
        res = await client.post(f"/api/webhooks/{token}", json={"ok": 1})
        assert res.status_code == 200 and res.json()["runId"] == sig
        await wait_status(engine, sig, "completed")
        signalled = await engine.get_run(sig)
        assert signalled is not None and signalled.output == {"ok": 1}
        res = await client.post(f"/api/webhooks/wh:{uid}-nobody", json={})
        assert res.status_code == 404
        assert res.json()["message"] == (
            f"no run is waiting on webhook wh:{uid}-nobody (nothing was stored)"
        )
        assert await engine.count_buffered_signals(prefix=f"wh:{uid}-nobody") == 0

        # bulk cancel: a bulk action does not page, so a page window is refused, not dropped
        for i in range(3):
            await engine.start(sleeper, i, run_id=f"{uid}-bulk-{i}", tags=[f"{uid}-bulk"])
        for i in range(3):
            await wait_status(engine, f"{uid}-bulk-{i}", "suspended")
        res = await client.post(f"/api/bulk/cancel?tag={uid}-bulk&limit=1")
        assert res.status_code == 400 and "`limit`" in res.json()["message"]
        res = await client.post(f"/api/bulk/cancel?tag={uid}-bulk")
        assert res.json() == {"matched": 3, "applied": 3}
        for i in range(3):
            await wait_status(engine, f"{uid}-bulk-{i}", "cancelled")


def _true(value: bool) -> Any:
    async def done() -> bool:
        return value

    return done()


async def test_read_only_refuses_every_mutation(engine: Engine, uid: str) -> None:
    @durably.workflow(f"{uid}.paused")
    async def paused(ctx: WorkflowCtx, x: int) -> int:
        await ctx.breakpoint()
        return x

    rid = f"{uid}-ro"
    await engine.start(paused, 1, run_id=rid)
    await wait_status(engine, rid, "suspended")
    async with client_for(create_app(engine, read_only=True)) as client:
        for path in (
            f"/api/runs/{rid}/retry",
            f"/api/runs/{rid}/retry-with-input",
            f"/api/runs/{rid}/cancel",
            f"/api/runs/{rid}/cancel?compensate=true",
            f"/api/runs/{rid}/continue",
            f"/api/runs/{rid}/redispatch",
            f"/api/runs/{rid}/updates/x",
            "/api/bulk/cancel",
            "/api/bulk/retry",
            "/api/webhooks/wh:x",
        ):
            res = await client.post(path, json={"input": 1})
            assert res.status_code == 403, path
            assert "read-only" in res.json()["message"]
        assert (await client.get(f"/api/runs/{rid}")).status_code == 200
        assert len((await client.get("/api/runs")).json()) == 1
    run = await engine.get_run(rid)
    assert run is not None and run.status == "suspended"


async def test_metrics_text(engine: Engine, uid: str) -> None:
    @durably.workflow(f"{uid}.one")
    async def one(ctx: WorkflowCtx, x: int) -> int:
        return x

    await engine.execute(one, 1)
    async with client_for(create_app(engine)) as client:
        res = await client.get("/api/metrics")
    assert res.status_code == 200
    assert res.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = res.text
    assert value(text, "durable_runs_completed_total", workflow=f"{uid}.one") == 1
    assert "# TYPE durable_runs_completed_total counter" in text
    for status in ("pending", "running", "dead"):
        assert value(text, "durable_runs", status=status) == 0


async def test_ui_shell_and_assets(engine: Engine) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(routes=[Mount("/durable", app=create_app(engine))])
    async with client_for(host) as client:
        page = await client.get("/durable/")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert page.headers["cache-control"] == "no-store, must-revalidate"
        start = page.text.index('id="durable-config">') + len('id="durable-config">')
        config = json.loads(page.text[start : page.text.index("</script>", start)])
        assert config == {"base": "/durable", "api": "/durable/api", "readOnly": False}
        assert 'href="/durable/assets/console.css"' in page.text
        css = await client.get("/durable/assets/console.css")
        assert css.status_code == 200
        assert css.headers["content-type"] == "text/css; charset=utf-8"
        assert css.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert (await client.get("/durable/assets/../index.html")).status_code == 404
        assert (await client.get("/durable/assets/sub%2Fx.js")).status_code == 404
        assert (await client.get("/durable/assets/missing.js")).status_code == 404
        assert (await client.get("/durable/api/runs")).json() == []


@pytest.mark.parametrize("base", ["/console/", "console"])
async def test_custom_base_paths(engine: Engine, base: str) -> None:
    app = create_app(engine, base_path=base, api_base_path="/v1/")
    async with client_for(app) as client:
        assert (await client.get("/console")).status_code == 200
        assert (await client.get("/v1/runs")).json() == []
        assert (await client.get("/console/api/runs")).status_code == 404
