"""The dashboard API over the real PostgreSQL store (fresh schema)."""

from __future__ import annotations

from urllib.parse import quote

import durably
from durably import Engine, FatalError, WorkflowCtx
from durably.dashboard import create_app
from tests.pg_support import fresh_schema, schema_url

from .conftest import FAST, client_for, wait_status


async def test_list_detail_fan_page_and_retry_on_postgres(uid: str) -> None:
    flaky = {"fail": True}

    @durably.step(f"{uid}.work")
    def work(x: int) -> int:
        if x == 7 and flaky["fail"]:
            raise FatalError("seven", code="SEVEN")
        return x

    @durably.workflow(f"{uid}.fan")
    async def fan(ctx: WorkflowCtx, n: int) -> int:
        return sum(await ctx.all(work, range(n)))

    async with fresh_schema(create=False) as schema, Engine(schema_url(schema), **FAST) as engine:
        rid = f"{uid}-pg"
        await engine.start(fan, 500, run_id=rid, tags=["pg"])
        await wait_status(engine, rid, "failed")
        async with client_for(create_app(engine)) as client:
            rows = (await client.get("/api/runs?tag=pg&status=failed")).json()
            assert [r["id"] for r in rows] == [rid]
            facets = (await client.get("/api/runs/facets?tag=pg")).json()
            assert facets == [{"status": "failed", "origin": None, "count": 1}]
            res = await client.get(f"/api/runs/{rid}?summarizeFansOver=100")
            detail = res.json()
            assert len(detail["fans"]) == 1 and detail["fans"][0]["counts"]["failed"] == 1
            cached = await client.get(
                f"/api/runs/{rid}?summarizeFansOver=100",
                headers={"If-None-Match": res.headers["etag"]},
            )
            assert cached.status_code == 304
            group = quote(detail["fans"][0]["group"], safe="")
            failed = (await client.get(f"/api/runs/{rid}/fans/{group}?failedOnly=true")).json()
            assert failed["total"] == 1 and failed["items"][0]["error"]["code"] == "SEVEN"

            flaky["fail"] = False
            assert (await client.post(f"/api/runs/{rid}/retry")).status_code == 200
            await wait_status(engine, rid, "completed")
            assert (await client.get(f"/api/runs/{rid}")).json()["run"]["output"] == sum(range(500))
