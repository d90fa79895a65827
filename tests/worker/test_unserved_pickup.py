"""Runs nobody serves never jam the pick-up.

Runs started by name (`durably.Client(store).start("name", ...)`) for a workflow no engine
registers — or for a version of a served workflow that no engine has — used to be claimed,
released and claimed again in a hot loop: first in pick-up order forever, with an ERROR line
per claim, and every run behind them stayed `pending`. They are now parked `blocked` with
the reason (`workflow.unserved`) and a back-off, logged once, and an engine that serves
them takes them within a poll. On SQLite and PostgreSQL (a fresh schema per test).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Client, Engine, WorkflowCtx, WorkflowRun
from durably.dashboard import create_app
from tests.cli.support import durably as durably_cli
from tests.dashboard.conftest import client_for
from tests.pg_support import fresh_schema, schema_url

UNSERVED = 1_000
POLL_MS = 200
# A run of the served workflow at a version nobody has: the same case as an unknown name.
UNSERVED_VERSIONS = 3


@pytest.fixture(params=["sqlite", "postgres"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/unserved.db"
        return
    async with fresh_schema() as schema:
        yield schema_url(schema)


def engine_options() -> dict[str, Any]:
    return {"timer_poll_ms": POLL_MS, "lease_ms": 5_000, "drain_timeout_ms": 2_000}


async def until_state(
    what: str,
    check: Any,
    caplog: pytest.LogCaptureFixture,
    *,
    timeout: float,
    flood: int,
) -> None:
    """Poll `check()` until it is true; fail at the deadline, or at once when the engine
    has logged more than `flood` lines (the old hot loop logs hundreds of thousands)."""
    deadline = time.monotonic() + timeout
    while not await check():
        logged = len(caplog.records)
        assert logged <= flood, f"waiting for {what}: {logged} log lines already"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def start_unserved(client: Client, name: str, served: str, uid: str) -> list[str]:
    ids = [f"{uid}-u{i:04d}" for i in range(UNSERVED)]
    for chunk in range(0, UNSERVED, 50):
        await asyncio.gather(
            *(
                client.start(name, {"n": i}, run_id=ids[i])
                for i in range(chunk, min(chunk + 50, UNSERVED))
            )
        )
    versioned = [f"{uid}-v{i}" for i in range(UNSERVED_VERSIONS)]
    for run_id in versioned:
        await client.start(served, 7, run_id=run_id, version="9")
    return ids + versioned


async def test_unserved_runs_are_parked_and_never_block_the_runs_behind_them(
    store_url: str, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durably")
    unserved_name = f"{uid}.nobody-serves-this"

    @durably.workflow(f"{uid}.job")
    async def job(ctx: WorkflowCtx, n: int) -> int:
        return n + 1

    async with Client(store_url) as client:
        parked_ids = await start_unserved(client, unserved_name, job.name, uid)
        parked = set(parked_ids)

        async def blocked() -> list[WorkflowRun]:
            return await client.list_runs(statuses=["blocked"], limit=2 * len(parked))

        engine = Engine(store=store_url, workflows=[job], **engine_options())
        async with engine:
            # A warm start: the engine has met the whole unserved backlog and a served run
            # went through behind it. (The old code never gets past this: it claims and
            # releases the same 16 runs forever.)
            warm = await client.start(job, 0, run_id=f"{uid}-warm")

            async def warmed_up() -> bool:
                run = await client.get_run(warm.run_id)
                if run is None or run.status != "completed":
                    return False
                return {r.id for r in await blocked()} >= parked

            await until_state("the warm-up", warmed_up, caplog, timeout=90, flood=20 * len(parked))

            # A real run started now, with the parked backlog older than it: it starts at
            # once (measured by its state, from just before its start).
            began = time.monotonic()
            real = await client.start(job, 41, run_id=f"{uid}-real")
            while True:
                run = await client.get_run(real.run_id)
                assert run is not None
                if run.status in ("running", "completed"):
                    break
                assert time.monotonic() - began < 10, run.status
                await asyncio.sleep(0.01)
            elapsed = time.monotonic() - began
            assert elapsed < 1.0, f"the real run waited {elapsed:.2f} s behind unserved runs"
            assert await real.result(timeout=30) == 42

            # Several poll intervals more (an absence is observed over time): the parked
            # runs are not claimed again before their back-off, and nothing more is logged.
            logged = len(caplog.records)
            await asyncio.sleep(6 * POLL_MS / 1000)
            assert len(caplog.records) == logged, [r.getMessage() for r in caplog.records[-5:]]
            per_run: dict[str, int] = {}
            for record in caplog.records:
                text = record.getMessage()
                for word in text.split():
                    if word in parked:
                        per_run[word] = per_run.get(word, 0) + 1
            assert max(per_run.values(), default=0) <= 2, max(per_run.items(), key=lambda i: i[1])
            assert len(caplog.records) <= 2 * len(parked) + 20

            # The reason is visible through the read API the console uses …
            listed = {r.id: r for r in await blocked()}
            for run_id in parked_ids:
                run = listed[run_id]
                assert run.error is not None and run.error.code == "workflow.unserved"
                assert run.workflow in run.error.message
            assert "'9'" in listed[f"{uid}-v0"].error.message  # type: ignore[union-attr]
            detail = await client.get_run_detail(parked_ids[0])
            assert detail is not None and detail.run.status == "blocked"
            assert detail.run.error is not None
            assert unserved_name in detail.run.error.message
            # … and in `durably runs list`.
            out = await asyncio.to_thread(
                durably_cli,
                "runs",
                "list",
                "--store",
                store_url,
                "--status",
                "blocked",
                "--limit",
                "5",
                cwd=Path.cwd(),
            )
            assert out.returncode == 0, out.stderr
            assert "REASON" in out.stdout and "workflow.unserved" in out.stdout, out.stdout
            assert "no worker here serves workflow" in out.stdout, out.stdout
            # … and in the console's list rows (which leave the error out).
            async with client_for(create_app(engine)) as http:
                response = await http.get("/api/runs", params={"status": "blocked", "limit": 5})
                rows = response.json()
            assert len(rows) == 5, rows
            assert all(r["blockedReason"]["code"] == "workflow.unserved" for r in rows), rows
            assert all("no worker here serves" in r["blockedReason"]["message"] for r in rows)

            # A worker that serves them starts later: every parked run is picked up (well
            # before their back-off: the serving engine takes them at its polls) and
            # completes, while the first engine keeps running.
            @durably.workflow(unserved_name)
            async def late(ctx: WorkflowCtx, data: dict[str, int]) -> int:
                return data["n"]

            @durably.workflow(job.name, version="9")
            async def job_v9(ctx: WorkflowCtx, n: int) -> int:
                return n * 2

            async with Engine(store=store_url, workflows=[late, job_v9], **engine_options()):

                async def all_done() -> bool:
                    runs = await client.list_runs(
                        workflows=[unserved_name, job.name], limit=2 * len(parked) + 10
                    )
                    done = {r.id for r in runs if r.status == "completed"}
                    return done >= parked

                await until_state(
                    "the late worker", all_done, caplog, timeout=120, flood=20 * len(parked)
                )
            assert await client.result(parked_ids[5], timeout=5) == 5
            assert await client.result(f"{uid}-v1", timeout=5) == 14
            done = await client.get_run(parked_ids[0])
            assert done is not None and done.error is None


async def test_a_mixed_fleet_each_engine_takes_its_own_runs_promptly(
    store_url: str, uid: str
) -> None:
    """Engine A serves W1, engine B serves W2, on one store: A parks the W2 runs it claims,
    and B takes them within a poll or two, not after A's back-off (5 s at first)."""

    @durably.workflow(f"{uid}.w1")
    async def w1(ctx: WorkflowCtx, n: int) -> str:
        return f"w1:{n}"

    @durably.workflow(f"{uid}.w2")
    async def w2(ctx: WorkflowCtx, n: int) -> str:
        return f"w2:{n}"

    async with (
        Engine(store=store_url, workflows=[w1], **engine_options()),
        Client(store_url) as client,
    ):
        # Only A runs at first: it parks the W2 runs.
        w2_ids = [f"{uid}-b{i}" for i in range(20)]
        for run_id in w2_ids:
            # By the Workflow object: a start by name would be refused (A beats and does
            # not serve W2), which is the point of the fleet check, not of this test.
            await client.start(w2, 1, run_id=run_id)
        deadline = time.monotonic() + 30
        while True:
            runs = [await client.get_run(i) for i in w2_ids]
            if all(r is not None and r.status == "blocked" for r in runs):
                break
            assert time.monotonic() < deadline, [r.status for r in runs if r is not None]
            await asyncio.sleep(0.05)
        async with Engine(store=store_url, workflows=[w2], **engine_options()):
            began = time.monotonic()
            results = await asyncio.gather(*(client.result(i, timeout=30) for i in w2_ids))
            # A's first back-off is 5 s; B's polls (every 0.2 s) take them long before.
            assert time.monotonic() - began < 4.0
            assert results == ["w2:1"] * len(w2_ids)
            assert (
                await client.result((await client.start(w1.name, 2)).run_id, timeout=30) == "w1:2"
            )
