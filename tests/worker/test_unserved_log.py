"""A run whose workflow no worker serves is parked visibly and logged once, never per poll:
its `waiting` says "no worker serves workflow …", and the worker keeps polling (runs it does
serve, started after, still complete). On SQLite and PostgreSQL (a fresh schema per test)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Client, Engine, RunWaiting, WorkflowCtx
from durably._core.models import RunQuery, WorkflowRun
from durably._read.lists import list_run_items
from tests.engine_support import wait_until
from tests.pg_support import fresh_schema, schema_url

POLL = {"timer_poll_ms": 50, "lease_ms": 2_000, "drain_timeout_ms": 2_000}


@pytest.fixture(params=["sqlite", "postgres"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/unserved-log.db"
        return
    async with fresh_schema() as schema:
        yield schema_url(schema)


def about(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING and name in r.getMessage()]


async def keeps_polling(client: Client, served: durably.Workflow[Any, Any], rounds: int) -> None:
    """Runs started by the client (no wake bus on SQLite: the worker's poll takes them) go
    through, one after the other: the worker polled at least `rounds` times."""
    for i in range(rounds):
        handle = await client.start(served.name, i)
        assert await handle.result(timeout=15) == i


async def test_unserved_runs_are_logged_once_and_marked_waiting(
    store_url: str, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="durably")
    typo = f"{uid}.invoices.convrt"

    @durably.workflow(f"{uid}.invoices.convert")
    async def convert(ctx: WorkflowCtx, n: int) -> int:
        return n

    async with Client(store_url) as client:
        # No worker beats yet: the starts are allowed (workers may come later).
        ids = [(await client.start(typo, i)).run_id for i in range(5)]
        async with Engine(store=store_url, workflows=[convert], **POLL):

            async def all_parked() -> bool:
                runs = [await client.get_run(i) for i in ids]
                return all(r is not None and r.status == "blocked" for r in runs)

            await wait_until(all_parked, timeout=15)
            await keeps_polling(client, convert, 5)
            waiting = await client.waiting_for(ids)
            # The list rows the console shows carry it too.
            items = await list_run_items(client.store, RunQuery(workflow=typo))
            listed = {i.run.id: i for i in items}
    assert len(about(caplog, typo)) == 1, [r.getMessage() for r in about(caplog, typo)]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    expected = RunWaiting(on="worker", name=typo, detail=f"no worker serves workflow {typo!r}")
    assert waiting == dict.fromkeys(ids, expected)
    assert all(listed[i].waiting == expected for i in ids)
    assert listed[ids[0]].to_row_json()["waiting"] == {
        "on": "worker",
        "name": typo,
        "detail": f"no worker serves workflow {typo!r}",
    }


async def test_a_cancelling_run_of_a_workflow_gone_is_parked_not_retried_per_poll(
    store_url: str, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A process died while the run's saga unwound, and no worker has its code any more:
    recovery used to claim it at every poll, log an ERROR and release it again."""
    caplog.set_level(logging.DEBUG, logger="durably")
    gone = f"{uid}.gone"

    @durably.workflow(f"{uid}.here")
    async def here(ctx: WorkflowCtx, n: int) -> int:
        return n

    now = datetime.now(UTC)
    async with Client(store_url) as client:
        await client.store.create_run(
            WorkflowRun(
                id=f"{uid}-c",
                workflow=gone,
                workflow_version="1",
                status="cancelling",
                created_at=now,
                updated_at=now,
                locked_by="a-process-that-died",
                locked_until=1,
            )
        )
        async with Engine(store=store_url, workflows=[here], **POLL):

            async def parked() -> bool:
                run = await client.get_run(f"{uid}-c")
                return run is not None and run.status == "blocked"

            await wait_until(parked, timeout=15)
            await keeps_polling(client, here, 5)
            run = await client.get_run(f"{uid}-c")
            waiting = await client.waiting_for([f"{uid}-c"])
            # An operator can still finish it: a plain cancel of the parked run.
            result = await client.cancel(f"{uid}-c")
    assert run is not None and run.status == "blocked" and run.recovery_attempts in (None, 0, 1)
    assert run.error is not None and run.error.details["origin"] == "cancelling"  # type: ignore[index]
    assert waiting[f"{uid}-c"].on == "worker"
    assert len(about(caplog, gone)) == 1, [r.getMessage() for r in about(caplog, gone)]
    assert result is not None and result.status == "cancelled"
