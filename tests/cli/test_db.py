"""`durably db upgrade [--sql]`."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.cli.support import durably, ok, sqlite_url


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {row[0] for row in rows}


def test_sql_prints_the_ddl_and_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "fresh.db"
    result = ok(durably("db", "upgrade", "--store", sqlite_url(db), "--sql", cwd=tmp_path))
    assert "CREATE TABLE" in result.stdout
    assert "durable_workflow_runs" in result.stdout
    assert "durable_step_checkpoints" in result.stdout
    assert not db.exists() or not _tables(db)


def test_upgrade_applies_then_is_idempotent(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    first = ok(durably("db", "upgrade", "--store", sqlite_url(db), cwd=tmp_path))
    assert "applied" in first.stdout
    tables = _tables(db)
    assert {"durable_workflow_runs", "durable_step_checkpoints"} <= tables
    second = ok(durably("db", "upgrade", "--store", sqlite_url(db), "--json", cwd=tmp_path))
    report = json.loads(second.stdout)
    assert report["applied"] is False and report["statements"] == []
    # Once applied, --sql has nothing pending.
    sql = ok(durably("db", "upgrade", "--store", sqlite_url(db), "--sql", cwd=tmp_path))
    assert "CREATE TABLE" not in sql.stdout


def test_default_store_comes_from_the_environment(tmp_path: Path) -> None:
    db = tmp_path / "env.db"
    ok(durably("db", "upgrade", cwd=tmp_path, env={"DURABLY_STORE": sqlite_url(db)}))
    assert "durable_workflow_runs" in _tables(db)
    assert not (tmp_path / "durably.db").exists()


def test_in_memory_store_is_refused(tmp_path: Path) -> None:
    result = durably("db", "upgrade", "--store", "memory", cwd=tmp_path)
    assert result.returncode == 2
    assert "in-memory" in result.stderr
