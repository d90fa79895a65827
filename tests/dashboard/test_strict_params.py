"""Query parameters are read strictly: a malformed or unknown parameter is a 400 naming it,
never a wider query; pages have a default size and a cap; a bulk action needs a filter or an
explicit `all=true`; answers name what went wrong (unknown action, unknown run, invalid
input)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import durably
from durably import Engine, FatalError, WorkflowCtx, WorkflowRun
from durably.dashboard import DashboardAuth, DashboardConfigError, create_app
from durably.dashboard.filters import MAX_LIMIT, MAX_OFFSET

from .conftest import client_for, wait_status


async def _sleepers(engine: Engine, uid: str, n: int, **attrs: Any) -> list[str]:
    @durably.workflow(f"{uid}.sleeper")
    async def sleeper(ctx: WorkflowCtx, x: int) -> int:
        await ctx.sleep(600)
        return x

    ids = []
    for i in range(n):
        run_id = f"{uid}-s{i}"
        await engine.start(sleeper, i, run_id=run_id, search_attributes=attrs or None)
        ids.append(run_id)
    for run_id in ids:
        await wait_status(engine, run_id, "suspended")
    return ids


async def _statuses(engine: Engine, ids: list[str]) -> set[str]:
    out = set()
    for run_id in ids:
        run = await engine.get_run(run_id)
        assert run is not None
        out.add(run.status)
    return out


async def test_an_unknown_bulk_action_is_refused(engine: Engine, uid: str) -> None:
    @durably.workflow(f"{uid}.broken")
    async def broken(ctx: WorkflowCtx, x: int) -> int:
        raise FatalError("no", code="NO")

    await engine.start(broken, 1, run_id=f"{uid}-broken")
    await wait_status(engine, f"{uid}-broken", "failed")
    async with client_for(create_app(engine)) as client:
        res = await client.post("/api/bulk/delete?status=failed")
        assert res.status_code == 400
        assert "delete" in res.json()["message"]
        assert "cancel" in res.json()["message"] and "retry" in res.json()["message"]
    assert await _statuses(engine, [f"{uid}-broken"]) == {"failed"}


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("attr=customer=42", "attr"),
        ("attr=customer:like:42", "attr"),
        ("attr=:eq:1", "attr"),
        ("tga=x", "tga"),
        ("status=runing", "status"),
        ("unattributed=yes", "unattributed"),
        ("compensate=maybe&tag=x", "compensate"),
        ("all=yes", "all"),
        ("limit=10&tag=x", "limit"),  # a bulk action does not page
    ],
)
async def test_a_malformed_bulk_filter_cancels_nothing(
    engine: Engine, uid: str, query: str, named: str
) -> None:
    ids = await _sleepers(engine, uid, 2, customer=42)
    async with client_for(create_app(engine)) as client:
        res = await client.post(f"/api/bulk/cancel?{query}")
        assert res.status_code == 400, res.text
        assert f"`{named}`" in res.json()["message"], res.json()
    assert await _statuses(engine, ids) == {"suspended"}


async def test_a_bulk_action_needs_a_filter_or_all(engine: Engine, uid: str) -> None:
    ids = await _sleepers(engine, uid, 2, customer=42)
    other = await _sleepers(engine, uid + "b", 1, customer=7)
    async with client_for(create_app(engine)) as client:
        for query in ("", "?tag=", "?all=false"):
            res = await client.post(f"/api/bulk/cancel{query}")
            assert res.status_code == 400 and "all=true" in res.json()["message"], query
        assert await _statuses(engine, ids + other) == {"suspended"}
        none = await client.post(f"/api/bulk/cancel?attr=customer:eq:42&workflow={uid}.nope")
        assert none.json() == {"matched": 0, "applied": 0}
        # an attribute filter selects exactly the runs the list shows for it
        res = await client.post("/api/bulk/cancel?attr=customer:eq:42")
        assert res.json() == {"matched": 2, "applied": 2}
        assert await _statuses(engine, ids) == {"cancelled"}
        assert await _statuses(engine, other) == {"suspended"}
        res = await client.post("/api/bulk/cancel?all=true")  # every run, explicitly
        assert res.json()["matched"] == 3
    assert await _statuses(engine, other) == {"cancelled"}


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/api/runs?limit=abc", "limit"),
        ("/api/runs?limit=-1", "limit"),
        ("/api/runs?limit=", "limit"),
        ("/api/runs?limit=1.5", "limit"),
        ("/api/runs?limit=99999999999999999999999", "limit"),
        (f"/api/runs?limit={MAX_LIMIT + 1}", "limit"),
        ("/api/runs?offset=99999999999999999999999", "offset"),
        (f"/api/runs?offset={MAX_OFFSET + 1}", "offset"),
        ("/api/runs?offset=" + "9" * 5000, "offset"),
        ("/api/runs?limit=%C2%B2", "limit"),  # a superscript two is a digit to Python
        ("/api/runs?attr=bad", "attr"),
        ("/api/runs?colour=red", "colour"),
        ("/api/runs/facets?attr=k:like:v", "attr"),
        ("/api/runs/values?field=tag&limit=x", "limit"),
        ("/api/runs/values?field=tag&nope=1", "nope"),
        ("/api/runs/r1?summarizeFansOver=abc", "summarizeFansOver"),
        ("/api/runs/r1/fans/g?limit=100000", "limit"),
        ("/api/runs/r1/fans/g?failedOnly=maybe", "failedOnly"),
    ],
)
async def test_a_bad_query_parameter_is_a_400_naming_it(
    engine: Engine, path: str, named: str
) -> None:
    async with client_for(create_app(engine)) as client:
        res = await client.get(path)
        assert res.status_code == 400, (path, res.status_code, res.text[:200])
        assert f"`{named}`" in res.json()["message"], res.json()


async def test_the_list_has_a_default_page_and_a_cap(engine: Engine) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    runs = [
        WorkflowRun(
            id=f"run-{i:04d}",
            workflow="bulk.wf",
            workflow_version="1",
            status="completed",
            created_at=start + timedelta(seconds=i),
            updated_at=start + timedelta(seconds=i),
        )
        for i in range(1_100)
    ]
    await engine.store.create_runs(runs)
    async with client_for(create_app(engine)) as client:
        assert len((await client.get("/api/runs")).json()) == 50
        assert len((await client.get(f"/api/runs?limit={MAX_LIMIT}")).json()) == MAX_LIMIT
        assert len((await client.get("/api/runs?limit=10&offset=1095")).json()) == 5
        assert (await client.get(f"/api/runs?offset={MAX_OFFSET}")).json() == []


async def test_retry_answers_404_and_422(engine: Engine, uid: str) -> None:
    @durably.workflow(f"{uid}.checked")
    async def checked(ctx: WorkflowCtx, x: int) -> int:
        return x

    await engine.execute(checked, 1, run_id=f"{uid}-ok")
    async with client_for(create_app(engine)) as client:
        res = await client.post(f"/api/runs/{uid}-nope/retry")
        assert res.status_code == 404 and res.json()["message"] == f"run {uid}-nope not found"
        bad = await client.post(
            f"/api/runs/{uid}-ok/retry-with-input", json={"input": "not a number"}
        )
        assert bad.status_code == 422, bad.text
        body = bad.json()
        assert "invalid input" in body["message"] and body["details"], body
        assert len(await engine.list_runs(workflow=f"{uid}.checked", limit=10)) == 1


def test_the_session_ttl_is_parsed_strictly(engine: Engine) -> None:
    from durably.dashboard.auth import Authenticator

    assert Authenticator(
        DashboardAuth(secret="x-0123456789abcdef", ttl="30min", login=print), ""
    ).ttl_ms == (30 * 60_000)
    assert Authenticator(
        DashboardAuth(secret="x-0123456789abcdef", ttl="30m", login=print), ""
    ).ttl_ms == (30 * 60_000)
    assert (
        Authenticator(DashboardAuth(secret="x-0123456789abcdef", ttl="2h", login=print), "").ttl_ms
        == 7_200_000
    )
    for ttl in ("1 fortnight", "soon", "-5m", "0s", ""):
        with pytest.raises(DashboardConfigError, match=re.escape(repr(ttl))):
            create_app(engine, auth={"secret": "x-0123456789abcdef", "login": print, "ttl": ttl})
