"""`GET runs/activity` (runs started, completed and failed per time bucket) against a real
Engine on a SQLite file: the counts, the filters, every bound refused with a 400, read-only
and auth."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Client, Engine, FatalError, WorkflowCtx
from durably.dashboard import create_app

from .conftest import FAST, client_for, wait_status

MINUTE = 60_000


async def _seed(engine: Engine, uid: str) -> None:
    @durably.workflow(f"{uid}.ok")
    async def ok(ctx: WorkflowCtx, x: int) -> int:
        return x

    @durably.workflow(f"{uid}.bad")
    async def bad(ctx: WorkflowCtx, x: int) -> int:
        raise FatalError("no")

    for i in range(3):
        await engine.start(ok, i, run_id=f"{uid}-ok-{i}", tags=["t"])
    await engine.start(bad, 0, run_id=f"{uid}-bad")
    for i in range(3):
        await wait_status(engine, f"{uid}-ok-{i}", "completed")
    await wait_status(engine, f"{uid}-bad", "failed")


def _totals(body: dict[str, Any]) -> tuple[int, int, int]:
    items = body["items"]
    return (
        sum(i["started"] for i in items),
        sum(i["completed"] for i in items),
        sum(i["failed"] for i in items),
    )


async def test_counts_per_bucket_with_filters(engine: Engine, uid: str) -> None:
    await _seed(engine, uid)
    async with client_for(create_app(engine, read_only=True)) as client:
        res = await client.get("/api/runs/activity", params={"bucketMs": MINUTE, "buckets": 10})
        assert res.status_code == 200, res.text
        body = res.json()
        assert _totals(body) == (4, 3, 1)
        assert body["bucketMs"] == MINUTE and body["buckets"] == 10
        assert body["untilMs"] - body["sinceMs"] == 10 * MINUTE
        assert body["untilMs"] % MINUTE == 0  # aligned: the buckets stay put as time passes
        assert body["untilMs"] >= int(time.time() * 1000)
        for item in body["items"]:
            assert body["sinceMs"] <= item["startMs"] < body["untilMs"]
            assert (item["startMs"] - body["sinceMs"]) % MINUTE == 0

        tagged = await client.get("/api/runs/activity", params={"tag": "t", "bucketMs": MINUTE})
        assert _totals(tagged.json()) == (3, 3, 0)
        other = await client.get("/api/runs/activity", params={"workflow": f"{uid}.bad"})
        assert _totals(other.json()) == (1, 0, 1)
        # a window that ended before the runs existed counts none of them
        past = await client.get(
            "/api/runs/activity", params={"until": body["sinceMs"], "bucketMs": MINUTE}
        )
        assert past.status_code == 200 and past.json()["items"] == []


@pytest.mark.parametrize(
    ("params", "word"),
    [
        ({"buckets": "501"}, "buckets"),
        ({"buckets": "0"}, "buckets"),
        ({"bucketMs": "999"}, "bucketMs"),
        ({"bucketMs": str(32 * 24 * 3_600_000)}, "bucketMs"),
        ({"until": "soon"}, "until"),
        ({"until": "-5"}, "until"),
        ({"until": "1000", "bucketMs": "1000", "buckets": "2"}, "before 1970"),
        ({"status": "failed"}, "status"),
        ({"limit": "5"}, "limit"),
        ({"bucket": "60000"}, "bucket"),
    ],
)
async def test_bounds_are_refused(engine: Engine, params: dict[str, str], word: str) -> None:
    async with client_for(create_app(engine)) as client:
        res = await client.get("/api/runs/activity", params=params)
    assert res.status_code == 400, res.text
    assert word in res.json()["message"]


async def test_needs_a_session_when_auth_is_on(engine: Engine) -> None:
    def login(username: str, password: str) -> Any:
        return {"id": username} if password == "pw" else None

    app = create_app(engine, auth={"secret": "s3cret-0123456789abcdef", "login": login})
    async with client_for(app) as client:
        assert (await client.get("/api/runs/activity")).status_code == 401
        res = await client.post("/login", json={"username": "u", "password": "pw"})
        assert res.status_code == 200
        assert (await client.get("/api/runs/activity")).status_code == 200


async def test_a_console_over_a_client_counts_from_the_store(tmp_path: Path, uid: str) -> None:
    @durably.workflow(f"{uid}.ok")
    async def ok(ctx: WorkflowCtx, x: int) -> int:
        return x

    url = f"sqlite:///{tmp_path / 'web.db'}"
    async with Engine(url, workflows=[ok], **FAST) as worker, Client(url) as web:
        rid = (await web.start(f"{uid}.ok", 1, run_id=f"{uid}-r")).run_id
        await wait_status(worker, rid, "completed")
        async with client_for(create_app(web)) as http:
            res = await http.get("/api/runs/activity", params={"bucketMs": MINUTE})
    assert res.status_code == 200, res.text
    assert _totals(res.json()) == (1, 1, 0)
