"""Fixtures for the SQL store tests: real SQLite files under `tmp_path`, never mocks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from durably._core.models import StepCheckpoint, WorkflowRun
from durably._store.sql import SqlStateStore

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


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqlStateStore]:
    sql = SqlStateStore.from_url(sqlite_url(db_path))
    await sql.ensure_schema()
    try:
        yield sql
    finally:
        await sql.close()
