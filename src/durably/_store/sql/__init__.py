"""The SQL StateStore (SQLite via aiosqlite, PostgreSQL via asyncpg) on SQLAlchemy 2 Core."""

from durably._store.sql.admission import PgAdmission, store_admission
from durably._store.sql.migrations import HEAD, current_version, upgrade, upgrade_sync
from durably._store.sql.schema import durable_managed_tables, metadata
from durably._store.sql.store import SqlStateStore

__all__ = [
    "HEAD",
    "PgAdmission",
    "SqlStateStore",
    "current_version",
    "durable_managed_tables",
    "metadata",
    "store_admission",
    "upgrade",
    "upgrade_sync",
]
