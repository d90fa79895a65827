"""Starts by name checked against the fleet: a worker `Engine` beating in the store (memory,
a real SQLite file, a fresh PostgreSQL schema) and a `Client` / a non-driving `Engine`
starting by name. Also `output_type=` on starts by name."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import durably
from durably import Client, Engine, WorkflowNotFoundError
from durably._core.errors import SerializationError
from durably._core.worker_beats import LIVE_WINDOW_MS, WorkerBeat, wall_ms
from tests.client.conftest import FAST

WAIT = 15.0


class Invoice(BaseModel):
    number: int
    total: float


def convert_workflow(uid: str) -> durably.Workflow[Any, Any]:
    @durably.workflow(f"{uid}.invoices.convert")
    async def convert(ctx: durably.WorkflowCtx, n: int) -> dict[str, Any]:
        return {"number": n, "total": n * 1.5}

    return convert


async def test_a_typo_against_a_live_fleet_is_refused_at_once(store: Any, uid: str) -> None:
    convert = convert_workflow(uid)
    async with Engine(store=store, workflows=[convert], **FAST), Client(store) as client:
        with pytest.raises(WorkflowNotFoundError) as refused:
            await client.start(f"{uid}.invoices.convrt", 1)
        # Nothing was written, and the right name still runs.
        assert await client.count_runs() == 0
        handle = await client.start(f"{uid}.invoices.convert", 2)
        assert await handle.result(timeout=WAIT) == {"number": 2, "total": 3.0}
    message = str(refused.value)
    assert f"did you mean '{uid}.invoices.convert'" in message
    assert "1 live worker in namespace 'default'" in message


async def test_no_worker_beating_allows_the_start(store: Any, uid: str) -> None:
    """Workers may start after the client: with none beating, the run is created."""
    async with Client(store) as client:
        handle = await client.start(f"{uid}.invoices.convrt", 1)
        run = await client.get_run(handle.run_id)
        assert run is not None and run.status == "pending"


async def test_a_worker_that_closed_is_no_fleet(store: Any, uid: str) -> None:
    convert = convert_workflow(uid)
    async with Client(store) as client:
        async with Engine(store=store, workflows=[convert], **FAST):
            with pytest.raises(WorkflowNotFoundError):
                await client.start(f"{uid}.other", 1)
        # Its row went with it: the fleet is empty again, so the start is allowed.
        handle = await client.start(f"{uid}.other", 1)
        assert await client.get_run(handle.run_id) is not None


async def test_a_stale_row_is_not_a_live_worker(store: Any, uid: str) -> None:
    async with Client(store) as client:
        await client.store.beat_worker(
            WorkerBeat(
                namespace="default",
                instance_id=f"{uid}-gone",
                beat_at=wall_ms() - LIVE_WINDOW_MS - 1_000,
                started_at=0,
                workflows=((f"{uid}.invoices.convert", "1"),),
            )
        )
        handle = await client.start(f"{uid}.invoices.convrt", 1)  # no live worker: allowed
        assert await client.get_run(handle.run_id) is not None
        await client.store.beat_worker(
            WorkerBeat(
                namespace="default",
                instance_id=f"{uid}-live",
                beat_at=wall_ms(),
                started_at=0,
                workflows=((f"{uid}.invoices.convert", "1"),),
            )
        )
        with pytest.raises(WorkflowNotFoundError, match=f"'{uid}.invoices.convert'"):
            await client.start(f"{uid}.invoices.convrt", 2)


async def test_another_namespace_is_judged_by_its_own_workers(store: Any, uid: str) -> None:
    convert = convert_workflow(uid)
    async with Engine(store=store, workflows=[convert], namespace="acme", **FAST):
        async with Client(store, namespace="globex") as client:
            # Nobody beats in globex: allowed.
            await client.start(f"{uid}.nope", 1)
            with pytest.raises(WorkflowNotFoundError, match="namespace 'acme'"):
                await client.start(f"{uid}.nope", 1, namespace="acme")


async def test_a_pinned_version_the_fleet_lacks_is_refused(store: Any, uid: str) -> None:
    convert = convert_workflow(uid)
    async with Engine(store=store, workflows=[convert], **FAST), Client(store) as client:
        with pytest.raises(WorkflowNotFoundError, match="they serve version 1"):
            await client.start(f"{uid}.invoices.convert", 1, version="9")
        handle = await client.start(f"{uid}.invoices.convert", 1, version="1")
        assert await handle.result(timeout=WAIT) == {"number": 1, "total": 1.5}


async def test_an_existing_run_id_keeps_its_answer(store: Any, uid: str) -> None:
    """A start naming an existing run by id returns it (or its conflict) as before."""
    async with Client(store) as client:
        first = await client.start(f"{uid}.retired", 1, run_id=f"{uid}-r")
        convert = convert_workflow(uid)
        async with Engine(store=store, workflows=[convert], drive=False, **FAST):
            pass
        async with Engine(store=store, workflows=[convert], **FAST):
            again = await client.start(f"{uid}.retired", 1, run_id=f"{uid}-r")
            assert again.run_id == first.run_id


async def test_a_non_driving_engine_starts_what_the_fleet_serves(store: Any, uid: str) -> None:
    """An engine that registers none of the workflows (a web tier's `drive=False`) starts
    by name what a live worker serves, and refuses a typo naming it."""
    convert = convert_workflow(uid)
    async with Engine(store=store, workflows=[convert], **FAST):
        async with Engine(store=store, workflows=[], drive=False, **FAST) as web:
            handle = await web.start(f"{uid}.invoices.convert", 3, output_type=Invoice)
            assert await handle.result(timeout=WAIT) == Invoice(number=3, total=4.5)
            with pytest.raises(WorkflowNotFoundError) as refused:
                await web.start(f"{uid}.invoices.convrt", 3)
    assert f"did you mean '{uid}.invoices.convert'" in str(refused.value)


async def test_a_driving_engine_without_the_workflow_starts_it_for_the_fleet(
    store: Any, uid: str
) -> None:
    convert = convert_workflow(uid)
    async with Engine(store=store, workflows=[convert], **FAST):
        async with Engine(store=store, workflows=[], **FAST) as other:
            handle = await other.start(f"{uid}.invoices.convert", 4)
            assert await handle.result(timeout=WAIT) == {"number": 4, "total": 6.0}
            with pytest.raises(WorkflowNotFoundError, match="none of the 2 live workers"):
                await other.start(f"{uid}.invoices.convrt", 4)


# ---------------------------------------------------------------------------- output_type


async def test_output_type_decodes_the_result(store: Any, uid: str) -> None:
    convert = convert_workflow(uid)
    async with Engine(store=store, workflows=[convert], **FAST), Client(store) as client:
        typed = await client.start(f"{uid}.invoices.convert", 2, output_type=Invoice)
        assert await typed.result(timeout=WAIT) == Invoice(number=2, total=3.0)
        wrong = await client.start(f"{uid}.invoices.convert", 2, output_type=int)
        with pytest.raises(SerializationError, match="is not a <class 'int'>"):
            await wrong.result(timeout=WAIT)


async def test_output_type_is_refused_where_it_cannot_apply(store: Any, uid: str) -> None:
    convert = convert_workflow(uid)
    async with Client(store) as client:
        with pytest.raises(TypeError, match="output_type= is for starts by name"):
            await client.start(convert, 1, output_type=Invoice)  # type: ignore[call-overload]

        class NotAType:
            def __init__(self, x: object) -> None: ...

        with pytest.raises(TypeError, match="cannot be validated"):
            await client.start(f"{uid}.invoices.convert", 1, output_type=NotAType)
        assert await client.count_runs() == 0


async def test_with_no_worker_beating_an_engine_goes_by_its_registry(store: Any, uid: str) -> None:
    """No fleet to ask: an engine that registers workflows refuses a name it lacks (it knows
    its app); one that registers none creates the run, as a `Client` does."""
    convert = convert_workflow(uid)
    async with Engine(store=store, workflows=[convert], drive=False, **FAST) as app:
        with pytest.raises(WorkflowNotFoundError, match="is not registered; did you mean"):
            await app.start(f"{uid}.invoices.convrt", 1)
    async with Engine(store=store, workflows=[], drive=False, **FAST) as web:
        handle = await web.start(f"{uid}.invoices.convrt", 1)
        run = await web.get_run(handle.run_id)
        assert run is not None and run.status == "pending"
