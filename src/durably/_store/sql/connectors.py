"""`connector_for`: which connection strategy a SQL store runs on.

Apart from the strategies themselves (`connection.py`, `pgconn.py`) so that neither imports
the other: the PostgreSQL one builds on the shared `Connector`/`Session` of `connection.py`.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from durably._store.sql.connection import Connector, PoolConnector, SqliteConnector
from durably._store.sql.dialect import SqlDialect
from durably._store.sql.pgconn import PgConnector

__all__ = ["connector_for"]


def connector_for(dialect: SqlDialect, engine: AsyncEngine) -> Connector:
    """SQLite: the group-committing writer; PostgreSQL: asyncpg directly (`pgconn.py`), or
    SQLAlchemy's pool for another async PostgreSQL driver."""
    if dialect.is_sqlite:
        return SqliteConnector(engine)
    if engine.dialect.driver == "asyncpg":
        return PgConnector(engine)
    return PoolConnector(engine)
