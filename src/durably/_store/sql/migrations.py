"""Versioned schema migrations of the SQL store (no alembic).

`durable_schema_version (version, applied_at)` records every applied migration. `MIGRATIONS` is
an ordered, append-only list; each migration renders its DDL for the target dialect. Migration 1
is the whole initial schema written as frozen DDL text: the live `MetaData` in
`schema.py` may evolve, a published migration never does (tests prove fresh == migrated).

`upgrade()` applies the pending migrations in ONE transaction under the schema lock
(`BEGIN IMMEDIATE` on SQLite, `pg_advisory_xact_lock(hashtext('durable_schema'))` on
PostgreSQL), so concurrent callers in several processes are safe: the loser waits, then sees
the new version and applies nothing. Every statement is also `IF NOT EXISTS`, so a database
created by `metadata.create_all` (or by an older durably without the version table) upgrades
cleanly.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.schema import CreateTable

from durably._core.errors import SchemaVersionError
from durably._store.sql import dialect as _d
from durably._store.sql import pg as _pg
from durably._store.sql.admission_schema import migration_v5
from durably._store.sql.beats import migration_v8
from durably._store.sql.connectors import connector_for
from durably._store.sql.quota_schema import migration_v6
from durably._store.sql.schedules import migration_v9
from durably._store.sql.schema import schema_version


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    render: Callable[[str], list[str]]
    """dialect name (`'sqlite'` / `'postgresql'`) → DDL statements."""


# ------------------------------------------------------------------ migration 1 (frozen)

_V1_DDL = """
CREATE TABLE IF NOT EXISTS durable_workflow_runs (
  id                         TEXT NOT NULL,
  workflow                   TEXT NOT NULL,
  workflow_version           TEXT NOT NULL,
  status                     TEXT NOT NULL,
  input                      TEXT,
  output                     TEXT,
  error                      TEXT,
  wake_at                    BIGINT,
  locked_by                  TEXT,
  locked_until               BIGINT,
  awaiting_decision_task_id  TEXT,
  recovery_attempts          INTEGER,
  tags                       TEXT,
  search_attributes          TEXT,
  priority                   INTEGER,
  namespace                  TEXT NOT NULL DEFAULT 'default',
  origin                     TEXT,
  created_at                 BIGINT NOT NULL,
  updated_at                 BIGINT NOT NULL,
  PRIMARY KEY (id)
);
CREATE INDEX IF NOT EXISTS durable_workflow_runs_status_wake_at_idx
  ON durable_workflow_runs (status, wake_at);
CREATE INDEX IF NOT EXISTS durable_workflow_runs_workflow_status_idx
  ON durable_workflow_runs (workflow, status);
CREATE INDEX IF NOT EXISTS durable_workflow_runs_namespace_status_idx
  ON durable_workflow_runs (namespace, status, created_at);
CREATE INDEX IF NOT EXISTS durable_workflow_runs_created_at_idx
  ON durable_workflow_runs (created_at);
CREATE INDEX IF NOT EXISTS durable_workflow_runs_status_updated_at_idx
  ON durable_workflow_runs (status, updated_at);
CREATE INDEX IF NOT EXISTS durable_workflow_runs_locked_by_idx
  ON durable_workflow_runs (locked_by);
CREATE TABLE IF NOT EXISTS durable_step_checkpoints (
  run_id          TEXT NOT NULL,
  seq             INTEGER NOT NULL,
  name            TEXT NOT NULL,
  kind            TEXT NOT NULL,
  step_id         TEXT NOT NULL,
  status          TEXT NOT NULL,
  input           TEXT,
  output          TEXT,
  error           TEXT,
  events          TEXT,
  attempts        INTEGER NOT NULL,
  worker_group    TEXT,
  parallel_group  TEXT,
  wake_at         BIGINT,
  enqueued_at     BIGINT,
  started_at      BIGINT NOT NULL,
  finished_at     BIGINT NOT NULL,
  PRIMARY KEY (run_id, seq)
);
CREATE INDEX IF NOT EXISTS durable_step_checkpoints_group_idx
  ON durable_step_checkpoints (run_id, parallel_group, status, seq);
CREATE TABLE IF NOT EXISTS durable_run_attributes (
  run_id     TEXT NOT NULL,
  key        TEXT NOT NULL,
  str_value  TEXT,
  num_value  {double},
  PRIMARY KEY (run_id, key)
);
CREATE INDEX IF NOT EXISTS durable_run_attributes_key_num_idx
  ON durable_run_attributes (key, num_value);
CREATE INDEX IF NOT EXISTS durable_run_attributes_key_str_idx
  ON durable_run_attributes (key, str_value);
CREATE TABLE IF NOT EXISTS durable_run_tags (
  run_id  TEXT NOT NULL,
  tag     TEXT NOT NULL,
  PRIMARY KEY (run_id, tag)
);
CREATE INDEX IF NOT EXISTS durable_run_tags_tag_idx ON durable_run_tags (tag, run_id);
CREATE TABLE IF NOT EXISTS durable_signal_waiters (
  token           TEXT NOT NULL,
  run_id          TEXT NOT NULL,
  seq             INTEGER NOT NULL,
  parallel_group  TEXT,
  PRIMARY KEY (token)
);
CREATE INDEX IF NOT EXISTS durable_signal_waiters_run_id_idx
  ON durable_signal_waiters (run_id, seq);
CREATE TABLE IF NOT EXISTS durable_buffered_signals (
  id       {identity_pk},
  token    TEXT NOT NULL,
  payload  TEXT
);
CREATE INDEX IF NOT EXISTS durable_buffered_signals_token_idx
  ON durable_buffered_signals (token, id);
CREATE TABLE IF NOT EXISTS durable_buffered_events (
  id            TEXT NOT NULL,
  name          TEXT NOT NULL,
  payload       TEXT,
  published_at  BIGINT NOT NULL,
  PRIMARY KEY (id)
);
CREATE INDEX IF NOT EXISTS durable_buffered_events_name_published_at_idx
  ON durable_buffered_events (name, published_at)
"""


def _split(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _v1(dialect_name: str) -> list[str]:
    return _split(
        _V1_DDL.format(
            double=_d.ddl_double(dialect_name),
            identity_pk=_d.ddl_identity_pk(dialect_name),
        )
    )


def _v2(dialect_name: str) -> list[str]:
    # The pick-up order of `claim_pending_runs` (status, created_at, id): without it each
    # claim sorts every pending run, O(N) per claim and O(N²) for a wide child fan.
    return [
        "CREATE INDEX IF NOT EXISTS durable_workflow_runs_status_created_idx"
        " ON durable_workflow_runs (status, created_at, id)"
    ]


def _v3(dialect_name: str) -> list[str]:
    # The bounds of the signal buffer: namespace (the token's text before its first ':'),
    # buffered_at and expires_at (epoch ms). Rows already buffered are stamped now; those
    # that came from outside the engine (every namespace but `child`, the engine's own
    # completion records) get the default 24-hour TTL from the upgrade, so a signal planted
    # before this version does not stay forever.
    from durably._store.sql.signal_buffer import migration_v3

    return migration_v3(dialect_name)


def _v4(dialect_name: str) -> list[str]:
    # Run priority: pending runs are picked up by priority (higher first; a run without one
    # counts as 0), then oldest. The index holds that order so the claim stays one statement
    # that reads only the rows it takes. It supersedes migration 2's (status, created_at, id),
    # whose only reader was the claim; keeping both would cost a second index write on every
    # status change of every run.
    return [
        "CREATE INDEX IF NOT EXISTS durable_workflow_runs_pickup_idx"
        " ON durable_workflow_runs (status, coalesce(priority, 0) DESC, created_at, id)",
        "DROP INDEX IF EXISTS durable_workflow_runs_status_created_idx",
    ]


_V7_CHECKPOINTS = "durable_step_checkpoints"
_V7_COLUMNS = (
    "run_id, seq, name, kind, step_id, status, input, output, error, events, attempts,"
    " worker_group, parallel_group, wake_at, enqueued_at, started_at, finished_at"
)


def _v7(dialect_name: str) -> list[str]:
    # Every failed attempt's error kept on the step's row (`attempt_errors`, JSON, nullable:
    # rows written before it read as "no history"). PostgreSQL adds the column in place
    # (`IF NOT EXISTS`). SQLite cannot add a column conditionally, and a database made by
    # `metadata.create_all` already has it, so the table is rebuilt (copy, drop, rename) as
    # migration 3 does — the same statements work on both shapes.
    table = _V7_CHECKPOINTS
    if dialect_name != "sqlite":
        return [f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS attempt_errors TEXT"]
    new = f"{table}__v7"
    return [
        f"DROP TABLE IF EXISTS {new}",
        f"CREATE TABLE {new} ("
        " run_id TEXT NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL,"
        " kind TEXT NOT NULL, step_id TEXT NOT NULL, status TEXT NOT NULL,"
        " input TEXT, output TEXT, error TEXT, events TEXT, attempts INTEGER NOT NULL,"
        " worker_group TEXT, parallel_group TEXT, wake_at BIGINT, enqueued_at BIGINT,"
        " started_at BIGINT NOT NULL, finished_at BIGINT NOT NULL, attempt_errors TEXT,"
        " PRIMARY KEY (run_id, seq))",
        f"INSERT INTO {new} ({_V7_COLUMNS}) SELECT {_V7_COLUMNS} FROM {table}",
        f"DROP TABLE {table}",
        f"ALTER TABLE {new} RENAME TO {table}",
        f"CREATE INDEX IF NOT EXISTS {table}_group_idx"
        f" ON {table} (run_id, parallel_group, status, seq)",
    ]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema", _v1),
    Migration(2, "pick-up order index for claim_pending_runs", _v2),
    Migration(3, "signal buffer bounds: namespace, buffered_at, expires_at", _v3),
    Migration(4, "pick-up order by priority, then age, for claim_pending_runs", _v4),
    # Fleet-wide flow-control queues: slots, waiters, fairness keys, and on PostgreSQL the
    # functions that admit a slot in one statement and release it.
    Migration(5, "flow-control admission tables (and functions on PostgreSQL)", migration_v5),
    Migration(6, "start dedup keys (durable_run_dedup)", migration_v6),
    Migration(7, "step attempt history (durable_step_checkpoints.attempt_errors)", _v7),
    Migration(8, "worker heartbeats (durable_worker_beats)", migration_v8),
    Migration(9, "persisted schedules (durable_schedules)", migration_v9),
)
HEAD: int = MIGRATIONS[-1].version


# ------------------------------------------------------------------ rendering


def _version_table_ddl(dialect_name: str) -> str:
    ddl = CreateTable(schema_version, if_not_exists=True)
    return str(ddl.compile(dialect=_d.offline_dialect(dialect_name))).strip()


def _stamp_sql(version: int, dialect_name: str) -> str:
    return (
        f"INSERT INTO {schema_version.name} (version, applied_at) "
        f"VALUES ({int(version)}, {_d.ddl_now_ms(dialect_name)})"
    )


def render(dialect_name: str, from_version: int = 0, to_version: int = HEAD) -> list[str]:
    """The statements that take a database at `from_version` to `to_version` (including the
    bootstrap of the version table and one version stamp per migration)."""
    pending = [m for m in MIGRATIONS if from_version < m.version <= to_version]
    if not pending:
        return []
    out = [_version_table_ddl(dialect_name)]
    for migration in pending:
        out.extend(migration.render(dialect_name))
        out.append(_stamp_sql(migration.version, dialect_name))
    return out


# ------------------------------------------------------------------ applying


def refuse_newer(found: int, where: str) -> None:
    """A schema stamped with a version this code does not know was written by a newer
    durably: refuse it before anything is changed.

    An older durably cannot know what the newer migrations changed (a column it does not
    fill, a table whose rows it would ignore), so it would work on the data as if it were
    its own; and there is no way down — a downgrade would have to drop what the newer
    version stored. The only safe remedy is to upgrade durably, which the error says."""
    if found > HEAD:
        raise SchemaVersionError(found, HEAD, where)


def _describe(url: URL, schema: str | None) -> str:
    """The database for a message: its URL without the password (and the schema)."""
    shown = url.render_as_string(hide_password=True)
    return f"{shown} (schema {schema})" if schema else shown


async def _read_version(conn: AsyncConnection) -> int:
    has_table = await conn.run_sync(
        lambda sync_conn: sa.inspect(sync_conn).has_table(schema_version.name)
    )
    if not has_table:
        return 0
    value = (await conn.execute(sa.select(sa.func.max(schema_version.c.version)))).scalar()
    return int(value) if value is not None else 0


async def apply_on(
    conn: AsyncConnection,
    dialect: _d.SqlDialect,
    *,
    to_version: int = HEAD,
    schema: str | None = None,
) -> list[str]:
    """Apply pending migrations on `conn`, which must already be inside the transaction the
    caller commits (the store runs this through its connector with `tx=True`). `schema`: the
    PostgreSQL schema the connections' `search_path` names (created here if missing)."""
    lock = dialect.schema_lock_statement(schema)
    if lock is not None:
        await conn.exec_driver_sql(lock)
    create = dialect.create_schema_statement(schema)
    if create is not None:
        await conn.exec_driver_sql(create)
    await conn.exec_driver_sql(_version_table_ddl(dialect.name))
    current = await _read_version(conn)
    refuse_newer(current, _describe(conn.engine.url, schema))
    statements = render(dialect.name, current, to_version)
    # The version table DDL already ran above; execute the rest.
    for statement in statements[1:]:
        await conn.exec_driver_sql(statement)
    return statements


def _sqlite_file_missing(url: URL) -> bool:
    if url.get_backend_name() != _d.SQLITE or _d.is_memory_sqlite(url):
        return False
    database = url.database or ""
    if database.startswith("file:"):
        return False
    return not os.path.exists(database)


async def _with_engine(
    engine_or_url: AsyncEngine | str | URL,
    body: Callable[[AsyncEngine], Any],
    *,
    offline_ok: bool = False,
) -> Any:
    if isinstance(engine_or_url, AsyncEngine):
        return await body(engine_or_url)
    url = _d.normalize_url(engine_or_url)
    if offline_ok and url.get_backend_name() == _d.SQLITE:
        # Read-only inspection: no pragmas (journal_mode=WAL would modify the file).
        engine = create_async_engine(url, **_d.default_engine_options(url))
    else:
        engine = _d.create_engine(url)
    try:
        return await body(engine)
    finally:
        await engine.dispose()


async def current_version(engine_or_url: AsyncEngine | str | URL) -> int:
    """The highest applied migration version (0 for an empty / unmanaged database)."""
    if not isinstance(engine_or_url, AsyncEngine):
        url = _d.normalize_url(engine_or_url)
        if _sqlite_file_missing(url):
            return 0

    async def body(engine: AsyncEngine) -> int:
        async with engine.connect() as conn:
            return await _read_version(conn)

    result: int = await _with_engine(engine_or_url, body, offline_ok=True)
    return result


async def upgrade(engine_or_url: AsyncEngine | str | URL, *, sql_only: bool = False) -> list[str]:
    """Apply every pending migration; return the SQL statements (empty when up to date).

    With `sql_only=True` nothing is executed or created: the statements that WOULD run are
    rendered for the target dialect (pending relative to the database's current version when it
    can be read, else from scratch) and returned.
    """
    if sql_only:
        if isinstance(engine_or_url, AsyncEngine):
            name = _d.dialect_name_of(engine_or_url.url)
        else:
            name = _d.dialect_name_of(_d.normalize_url(engine_or_url))
        try:
            version = await current_version(engine_or_url)
        except Exception:
            version = 0  # unreachable database: render the full script
        url = engine_or_url.url if isinstance(engine_or_url, AsyncEngine) else engine_or_url
        refuse_newer(version, _describe(_d.normalize_url(url), None))
        return render(name, version)

    async def body(engine: AsyncEngine) -> list[str]:
        dialect = _d.SqlDialect(engine.dialect.name)
        connector = connector_for(dialect, engine)
        try:
            schema = _pg.schema_of(engine)
            return await connector.schema_transaction(
                lambda conn: apply_on(conn, dialect, schema=schema)
            )
        finally:
            await connector.close()

    result: list[str] = await _with_engine(engine_or_url, body)
    return result


def upgrade_sync(url: str, sql_only: bool = False) -> list[str]:
    """Blocking `upgrade` for CLIs (`durably db upgrade [--sql]`); not for a running loop."""
    return asyncio.run(upgrade(url, sql_only=sql_only))


def current_version_sync(url: str) -> int:
    return asyncio.run(current_version(url))


__all__ = [
    "HEAD",
    "MIGRATIONS",
    "Migration",
    "apply_on",
    "current_version",
    "current_version_sync",
    "refuse_newer",
    "render",
    "upgrade",
    "upgrade_sync",
]
