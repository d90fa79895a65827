"""Shared models and helpers of the StateStore conformance suite.

The parametrized `store` fixture itself lives in `conftest.py`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from durably import AttributeFilter, RunQuery, StateStore, StepCheckpoint, WorkflowRun


class ConformantStore(StateStore, Protocol):
    statement_count: int


# ------------------------------------------------------------------ fixtures

T0 = datetime(2026, 6, 11, tzinfo=UTC)


def at(minutes: int = 0, *, ms: int = 0) -> datetime:
    return T0 + timedelta(minutes=minutes, milliseconds=ms)


def make_run(run_id: str = "r1", **kw: Any) -> WorkflowRun:
    fields: dict[str, Any] = {
        "id": run_id,
        "workflow": "checkout",
        "workflow_version": "1",
        "status": "running",
        "input": {"orderId": "o1"},
        "created_at": T0,
        "updated_at": T0,
    }
    fields.update(kw)
    return WorkflowRun(**fields)


def make_cp(run_id: str = "r1", seq: int = 0, **kw: Any) -> StepCheckpoint:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "seq": seq,
        "name": "reserve",
        "kind": "local",
        "step_id": f"{run_id}:{seq}",
        "status": "completed",
        "output": {"ok": True},
        "attempts": 1,
        "started_at": T0,
        "finished_at": T0,
    }
    fields.update(kw)
    return StepCheckpoint(**fields)


async def ids(store: ConformantStore, query: RunQuery) -> list[str]:
    return [r.id for r in await store.list_runs(query)]


async def id_set(store: ConformantStore, query: RunQuery) -> set[str]:
    return set(await ids(store, query))


async def seed_attrs(store: ConformantStore) -> None:
    rows: list[tuple[str, str, dict[str, Any] | None]] = [
        ("a", "running", {"tier": "free", "amount": 10, "vip": True}),
        ("b", "running", {"tier": "pro", "amount": 200, "vip": False}),
        ("c", "completed", {"tier": "pro", "amount": 55.5}),
        ("d", "running", {"tier": "enterprise"}),
        ("e", "running", None),
    ]
    for minute, (run_id, status, attrs) in enumerate(rows):
        await store.create_run(
            make_run(run_id, status=status, search_attributes=attrs, created_at=at(minute))
        )


def attr(key: str, op: Any, value: Any = None, values: Any = None) -> RunQuery:
    return RunQuery(attributes=[AttributeFilter(key, op, value, values)])
