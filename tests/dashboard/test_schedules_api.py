"""The console's schedules API over a real SQLite store: `GET schedules` lists static and
persisted ones with their cadence, next fires and recent runs; a persisted one is paused,
unpaused and triggered through the same front door as every other change (a cross-site or
read-only request changes nothing); a static one is read-only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Client, Engine, RunQuery, WorkflowCtx
from durably.dashboard import create_app
from tests.engine_support import wait_status

from .conftest import FAST, client_for

JSON = {"Content-Type": "application/json"}
SAME_ORIGIN = {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin", **JSON}
CROSS_SITE = [
    {"Origin": "http://evil.example", **JSON},
    {"Sec-Fetch-Site": "cross-site", **JSON},
    {"Origin": "http://localhost", "Content-Type": "text/plain"},
]
HOUR = 3_600_000
# A still clock half way through an hour: `hourly` fires the window it is created in (its
# current one) once, and no other window falls due during a test.
WINDOW = 470_000 * HOUR
NOW = WINDOW + HOUR // 2
WINDOW_RUN = f"sched:hourly:{WINDOW}"


@durably.workflow("dash.sched.report")
async def report(ctx: WorkflowCtx, n: int = 0) -> int:
    return n


def _engine(tmp_path: Path) -> Engine:
    return Engine(
        f"sqlite:///{tmp_path / 'sched.db'}",
        workflows=[report],
        clock=lambda: NOW,
        # Declared paused, so none of its windows fires during the test.
        schedules=[durably.Schedule("yearly", report, cron="0 0 1 1 *", paused=True)],
        **FAST,
    )


async def _persisted(engine: Engine) -> None:
    await engine.schedules.create(
        durably.Schedule("hourly", report, 3, every="1h", tags=("reports",))
    )
    fired = await wait_status(engine, WINDOW_RUN, "completed")
    assert fired.output == 3


async def _runs(engine: Engine) -> list[str]:
    return sorted(r.id for r in await engine.store.list_runs(RunQuery(workflow=report.name)))


async def test_the_list_and_one_schedule(tmp_path: Path) -> None:
    async with _engine(tmp_path) as engine:
        await _persisted(engine)
        async with client_for(create_app(engine)) as client:
            listed = (await client.get("/api/schedules")).json()
            assert [(s["schedule"]["id"], s["source"]) for s in listed] == [
                ("yearly", "static"),
                ("hourly", "persisted"),
            ]
            static, hourly = listed
            assert (
                static["schedule"]["cron"],
                static["schedule"]["timezone"],
                static["schedule"]["everyMs"],
            ) == (
                "0 0 1 1 *",
                "UTC",
                None,
            )
            assert (
                hourly["schedule"]["everyMs"],
                hourly["schedule"]["cron"],
                hourly["schedule"]["workflow"],
            ) == (
                HOUR,
                None,
                report.name,
            )
            assert hourly["schedule"]["paused"] is False and hourly["schedule"]["tags"] == [
                "reports"
            ]
            assert hourly["schedule"]["input"] == 3
            assert len(hourly["nextFires"]) == 5
            assert hourly["nextFires"] == [WINDOW + i * HOUR for i in range(1, 6)]
            assert hourly["createdAt"] == NOW and hourly["firedCount"] == 1
            assert hourly["recentRuns"] == [
                {"runId": WINDOW_RUN, "status": "completed", "windowMs": WINDOW}
            ]
            assert (hourly["lastRunId"], hourly["lastRunStatus"]) == (WINDOW_RUN, "completed")
            assert (await client.get("/api/schedules/hourly")).json() == hourly
            assert static["schedule"]["paused"] is True and static["nextFires"] == []
            paused_only = (await client.get("/api/schedules?paused=true")).json()
            assert [s["schedule"]["id"] for s in paused_only] == ["yearly"]
            by_workflow = (await client.get(f"/api/schedules?workflow={report.name}")).json()
            assert len(by_workflow) == 2
            assert len((await client.get("/api/schedules?limit=1")).json()) == 1
            missing = await client.get("/api/schedules/ghost")
            assert missing.status_code == 404 and "ghost" in missing.json()["message"]
            for bad in ("?paused=maybe", "?limit=5000", "?tag=x", "?workflow="):
                res = await client.get("/api/schedules" + bad)
                assert res.status_code == 400, bad


async def test_pause_unpause_and_trigger_a_persisted_schedule(tmp_path: Path) -> None:
    async with _engine(tmp_path) as engine:
        await _persisted(engine)
        async with client_for(create_app(engine)) as client:
            paused = await client.post(
                "/api/schedules/hourly/pause", json={"note": "db migration"}, headers=SAME_ORIGIN
            )
            assert paused.status_code == 200, paused.text
            assert (
                paused.json()["schedule"]["paused"] is True
                and paused.json()["note"] == "db migration"
            )
            assert paused.json()["nextFires"] == []
            assert (await engine.schedules.describe("hourly")).schedule.paused

            unpaused = await client.post("/api/schedules/hourly/unpause", headers=SAME_ORIGIN)
            assert unpaused.status_code == 200, unpaused.text
            assert (
                unpaused.json()["schedule"]["paused"] is False and unpaused.json()["note"] is None
            )
            assert len(unpaused.json()["nextFires"]) == 5

            fired = await client.post("/api/schedules/hourly/trigger", headers=SAME_ORIGIN)
            assert fired.status_code == 200, fired.text
            run_id = fired.json()["runId"]
            assert run_id == f"sched:hourly:manual:{NOW}"
            assert fired.json()["scheduleId"] == "hourly"
            assert await engine.result(run_id, timeout=20) == 3
            after = (await client.get("/api/schedules/hourly")).json()
            assert after["lastRunId"] == run_id and after["lastRunStatus"] == "completed"
            assert after["recentRuns"] == [
                {"runId": run_id, "status": "completed", "windowMs": None},
                {"runId": WINDOW_RUN, "status": "completed", "windowMs": WINDOW},
            ]

            for body in ({"reason": "x"}, {"note": 5}, {"note": "x" * 1001}, [1]):
                res = await client.post(
                    "/api/schedules/hourly/pause", json=body, headers=SAME_ORIGIN
                )
                assert res.status_code == 400, body
            extra = await client.post(
                "/api/schedules/hourly/trigger", json={"now": True}, headers=SAME_ORIGIN
            )
            assert extra.status_code == 400
            ghost = await client.post("/api/schedules/ghost/pause", headers=SAME_ORIGIN)
            assert ghost.status_code == 404
        assert not (await engine.schedules.describe("hourly")).schedule.paused
        assert await _runs(engine) == [WINDOW_RUN, run_id]  # the refused trigger: nothing


async def test_a_static_schedule_is_read_only(tmp_path: Path) -> None:
    async with _engine(tmp_path) as engine:
        async with client_for(create_app(engine)) as client:
            for verb in ("pause", "unpause", "trigger"):
                res = await client.post(f"/api/schedules/yearly/{verb}", headers=SAME_ORIGIN)
                assert res.status_code == 409, (verb, res.text)
                assert "declared in code" in res.json()["message"]
        assert await _runs(engine) == []
        assert (await engine.schedules.describe("yearly")).schedule.paused  # as declared


@pytest.mark.parametrize("headers", CROSS_SITE, ids=lambda h: ",".join(h.values()))
@pytest.mark.parametrize("verb", ["pause", "trigger"])
async def test_a_cross_site_request_changes_nothing(
    tmp_path: Path, headers: dict[str, str], verb: str
) -> None:
    async with _engine(tmp_path) as engine:
        await _persisted(engine)
        async with client_for(create_app(engine)) as client:
            res = await client.post(f"/api/schedules/hourly/{verb}", content="{}", headers=headers)
        assert res.status_code in (403, 415), res.text
        assert not (await engine.schedules.describe("hourly")).schedule.paused
        assert await _runs(engine) == [WINDOW_RUN]


async def test_a_read_only_console_changes_nothing(tmp_path: Path) -> None:
    async with _engine(tmp_path) as engine:
        await _persisted(engine)
        async with client_for(create_app(engine, read_only=True)) as client:
            assert (await client.get("/api/schedules/hourly")).status_code == 200
            for verb in ("pause", "unpause", "trigger"):
                res = await client.post(f"/api/schedules/hourly/{verb}", headers=SAME_ORIGIN)
                assert res.status_code == 403 and "schedule" in res.json()["message"], verb
        assert not (await engine.schedules.describe("hourly")).schedule.paused
        assert await _runs(engine) == [WINDOW_RUN]


async def test_a_console_over_a_client_lists_and_changes_persisted_schedules(
    tmp_path: Path,
) -> None:
    async with _engine(tmp_path) as engine:
        await _persisted(engine)
        async with Client(f"sqlite:///{tmp_path / 'sched.db'}") as web:
            async with client_for(create_app(web)) as client:
                listed: list[dict[str, Any]] = (await client.get("/api/schedules")).json()
                # a web tier knows no engine's declarations: the persisted ones only
                assert [s["schedule"]["id"] for s in listed] == ["hourly"]
                res = await client.post("/api/schedules/hourly/pause", headers=SAME_ORIGIN)
                assert res.status_code == 200 and res.json()["schedule"]["paused"] is True
        assert (await engine.schedules.describe("hourly")).schedule.paused


async def test_a_console_with_sign_in_refuses_the_schedules_routes_without_a_session(
    tmp_path: Path,
) -> None:
    def login(username: str, password: str) -> Any:
        return {"id": "ops"} if password == "pw" else None

    async with _engine(tmp_path) as engine:
        await _persisted(engine)
        app = create_app(engine, auth={"secret": "s3cret-0123456789abcdef", "login": login})
        async with client_for(app) as client:
            assert (await client.get("/api/schedules")).status_code == 401
            assert (await client.get("/api/schedules/hourly")).status_code == 401
            for verb in ("pause", "unpause", "trigger"):
                res = await client.post(f"/api/schedules/hourly/{verb}", headers=SAME_ORIGIN)
                assert res.status_code == 401, verb
            signed_in = await client.post(
                "/login", json={"username": "ops", "password": "pw"}, headers=SAME_ORIGIN
            )
            assert signed_in.status_code == 200, signed_in.text
            # the session cookie is kept by the client: now the same request passes
            res = await client.post("/api/schedules/hourly/pause", headers=SAME_ORIGIN)
            assert res.status_code == 200 and res.json()["schedule"]["paused"] is True
        assert await _runs(engine) == [WINDOW_RUN]
