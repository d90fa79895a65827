"""Row mapping edge cases (NULLs, defaults, timestamps, strict JSON), checked against the
raw rows, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from durably import RunQuery, SerializationError, StepError, StepEvent
from durably._core.models import utc_from_ms
from durably._store.sql import SqlStateStore
from tests.store.support import pickup, take_buffered

from .conftest import BOTH, T0, at, is_pg, make_cp, make_run, open_store, raw


@pytest.fixture(params=BOTH)
async def store(request: pytest.FixtureRequest, db_path: Path) -> AsyncIterator[SqlStateStore]:
    async with open_store(request.param, db_path) as sql:
        yield sql


async def test_namespace_none_is_written_as_default(store: SqlStateStore) -> None:
    await store.create_run(make_run(namespace=None))
    run = await store.get_run("r1")
    assert run is not None and run.namespace == "default"
    assert await raw(store, "SELECT namespace FROM durable_workflow_runs") == [("default",)]
    await store.update_run("r1", {"namespace": "acme"})
    await store.update_run("r1", {"namespace": None})  # can never be cleared
    assert await raw(store, "SELECT namespace FROM durable_workflow_runs") == [("default",)]


async def test_legacy_null_namespace_reads_default_and_matches_default(
    store: SqlStateStore,
) -> None:
    await store.create_run(make_run("legacy", status="pending"))
    await store.create_run(make_run("other", status="pending", namespace="beta"))
    # A database upgraded from a schema without `namespace` may hold NULLs (read as 'default'):
    # rebuild the table without constraints (CREATE TABLE AS) and null the column.
    if is_pg(store):
        await raw(store, "ALTER TABLE durable_workflow_runs ALTER COLUMN namespace DROP NOT NULL")
    else:
        for statement in (
            "CREATE TABLE legacy_runs AS SELECT * FROM durable_workflow_runs",
            "DROP TABLE durable_workflow_runs",
            "ALTER TABLE legacy_runs RENAME TO durable_workflow_runs",
        ):
            await raw(store, statement)
    await raw(store, "UPDATE durable_workflow_runs SET namespace = NULL WHERE id = 'legacy'")
    run = await store.get_run("legacy")
    assert run is not None and run.namespace == "default"
    assert [r.id for r in await pickup(store, 10, "default")] == ["legacy"]
    assert [r.id for r in await store.list_runs(RunQuery(namespace="default"))] == ["legacy"]
    assert [r.id for r in await store.list_runs(RunQuery(namespaces=["default"]))] == ["legacy"]
    assert [r.id for r in await pickup(store, 10, "beta")] == ["other"]
    assert len(await pickup(store, 10)) == 2
    claimed = await store.claim_pending_runs("o", 10, 0, 5, "default")
    assert [(r.id, r.namespace) for r in claimed] == [("legacy", "default")]


async def test_origin_and_priority_stay_absent(store: SqlStateStore) -> None:
    await store.create_run(make_run(origin=None))
    run = await store.get_run("r1")
    assert run is not None
    assert run.origin is None and run.priority is None
    assert await raw(store, "SELECT origin, priority FROM durable_workflow_runs") == [(None, None)]
    await store.create_run(make_run("r2", origin="pkg", priority=7))
    run2 = await store.get_run("r2")
    assert run2 is not None and run2.origin == "pkg" and run2.priority == 7


async def test_enqueued_at_written_as_started_and_null_reads_started(store: SqlStateStore) -> None:
    await store.save_checkpoint(make_cp(started_at=at(1), finished_at=at(2)))
    ((enqueued,),) = await raw(store, "SELECT enqueued_at FROM durable_step_checkpoints")
    assert utc_from_ms(enqueued) == at(1)
    await raw(store, "UPDATE durable_step_checkpoints SET enqueued_at = NULL")
    cp = await store.get_checkpoint("r1", 0)
    assert cp is not None and cp.enqueued_at == at(1) == cp.started_at
    await store.save_checkpoint(make_cp(seq=1, enqueued_at=at(0, ms=5), started_at=at(1)))
    cp1 = await store.get_checkpoint("r1", 1)
    assert cp1 is not None and cp1.enqueued_at == at(0, ms=5)


@pytest.mark.parametrize(
    "details",
    [
        [{"path": ["a", 0], "message": "bad"}],
        {"nested": {"list": [1, 2.5, None, True]}, "ünï": "çødé"},
        "plain",
        42,
        3.25,
        False,
        None,
    ],
)
async def test_error_details_round_trip(store: SqlStateStore, details: Any) -> None:
    error = StepError(message="boom", code="E1", details=details, retryable=False, stack="tb")
    await store.create_run(make_run(status="failed", error=error))
    await store.save_checkpoint(make_cp(status="failed", error=error))
    run = await store.get_run("r1")
    cp = await store.get_checkpoint("r1", 0)
    assert run is not None and run.error == error
    assert cp is not None and cp.error == error


async def test_timestamps_are_epoch_ms_and_aware_utc(store: SqlStateStore) -> None:
    await store.create_run(make_run(created_at=at(0, ms=123), updated_at=at(5)))
    assert await raw(store, "SELECT created_at, updated_at FROM durable_workflow_runs") == [
        (int(at(0, ms=123).timestamp() * 1000), int(at(5).timestamp() * 1000))
    ]
    run = await store.get_run("r1")
    assert run is not None
    assert run.created_at == at(0, ms=123) and run.created_at.tzinfo is not None
    assert run.updated_at == at(5)


async def test_json_columns_are_text_and_preserve_key_order(store: SqlStateStore) -> None:
    payload = {"z": 1, "a": [1, {"b": None}], "m": "ü"}
    await store.create_run(make_run(input=payload, tags=("b", "a", "b")))
    ((inp, tags),) = await raw(store, "SELECT input, tags FROM durable_workflow_runs")
    assert inp == '{"z":1,"a":[1,{"b":null}],"m":"ü"}'
    assert tags == '["b","a","b"]'
    run = await store.get_run("r1")
    assert run is not None and list(run.input) == ["z", "a", "m"] and run.tags == ("b", "a", "b")
    # the tag side table keeps set semantics
    assert await raw(store, "SELECT tag FROM durable_run_tags ORDER BY tag") == [("a",), ("b",)]


async def test_events_round_trip_and_empty_reads_absent(store: SqlStateStore) -> None:
    events = (
        StepEvent(at=1, level="info", message="hi", data={"x": [1]}),
        StepEvent(at=2, level="warn", message="sub", sub_id="s1", status="ok", phase="p"),
    )
    await store.save_checkpoint(make_cp(events=events))
    await store.save_checkpoint(make_cp(seq=1, events=()))
    cp0 = await store.get_checkpoint("r1", 0)
    cp1 = await store.get_checkpoint("r1", 1)
    assert cp0 is not None and cp0.events == events
    assert cp1 is not None and cp1.events is None


async def test_null_and_absent_json_payloads(store: SqlStateStore) -> None:
    await store.create_run(make_run(input=None))
    await store.buffer_signal("tok", None)
    assert await raw(store, "SELECT input, output, error FROM durable_workflow_runs") == [
        (None, None, None)
    ]
    hit = await take_buffered(store, "tok")
    assert hit is not None and hit.payload is None


async def test_non_json_values_raise_before_writing(store: SqlStateStore) -> None:
    with pytest.raises(SerializationError):
        await store.create_run(make_run(input={"x": float("nan")}))
    with pytest.raises(SerializationError):
        await store.save_checkpoint(make_cp(output=object()))
    with pytest.raises(SerializationError):
        await store.save_checkpoints_if_pending([make_cp(), make_cp(seq=1, output=float("inf"))])
    assert await raw(store, "SELECT count(*) FROM durable_workflow_runs") == [(0,)]
    assert await raw(store, "SELECT count(*) FROM durable_step_checkpoints") == [(0,)]


async def test_search_attribute_rows(store: SqlStateStore) -> None:
    attrs = {"vip": True, "off": False, "amount": 10, "ratio": 0.5, "tier": "pro"}
    await store.create_run(make_run(search_attributes=attrs))
    rows = await raw(
        store, "SELECT key, str_value, num_value FROM durable_run_attributes ORDER BY key"
    )
    assert rows == [
        ("amount", None, 10.0),
        ("off", "false", None),
        ("ratio", None, 0.5),
        ("tier", "pro", None),
        ("vip", "true", None),
    ]
    run = await store.get_run("r1")
    assert run is not None and run.search_attributes == attrs
    assert type(run.search_attributes["amount"]) is int
    assert type(run.search_attributes["vip"]) is bool


async def test_created_run_round_trips_every_field(store: SqlStateStore) -> None:
    run = make_run(
        status="suspended",
        output=[1, 2],
        wake_at=1_800_000_000_000,
        locked_by="inst-1",
        locked_until=1_800_000_000_500,
        recovery_attempts=2,
        tags=("x",),
        search_attributes={"k": "v"},
        namespace="acme",
        origin="pkg",
        priority=-3,
        awaiting_decision_task_id="task-9",
        created_at=T0,
        updated_at=at(1),
    )
    await store.create_run(run)
    assert await store.get_run("r1") == run
