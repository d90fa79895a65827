"""Every difference between the SQLite and PostgreSQL flavours of the SQL store lives here.

- URL normalisation (`sqlite://…` → `sqlite+aiosqlite://…`, `postgresql://…` →
  `postgresql+asyncpg://…`) and default engine options (in-memory SQLite gets a `StaticPool`);
- the per-connection SQLite pragmas (WAL, `synchronous` — NORMAL, or FULL from the URL's
  `?synchronous=full` —, `busy_timeout`, no FKs, case-sensitive LIKE);
- column types that differ (`REAL` vs `DOUBLE PRECISION`, `AUTOINCREMENT` vs `IDENTITY`);
- upsert (`INSERT … ON CONFLICT … DO UPDATE` exists on both, via each dialect's `insert`);
- RETURNING support (SQLite ≥ 3.35), prefix predicates and the "take the oldest buffered
  signal" statement;
- the schema lock for migrations (`BEGIN IMMEDIATE` on SQLite, `pg_advisory_xact_lock` on PG).

How connections are obtained (one serialised SQLite writer vs. the PostgreSQL pool) is the
other backend difference; it lives in `connection.py` and `pgconn.py` (chosen by
`connectors.connector_for`).
"""

from __future__ import annotations

import inspect
import json
import sqlite3
import weakref
from collections.abc import Sequence
from contextlib import closing
from typing import Any, cast
from urllib.parse import parse_qsl

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql as _pg
from sqlalchemy.dialects import sqlite as _sqlite
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.dml import Insert

from durably._extras import require_postgres_driver
from durably._store.sql import pg as _pg_options

SQLITE = "sqlite"
POSTGRESQL = "postgresql"

BUSY_TIMEOUT_MS = 10_000

# SQLite durability, a choice of the user's (`sqlite:///app.db?synchronous=full`):
# - `normal` (the default): in WAL mode a commit is not fsynced; the WAL is synced at each
#   checkpoint. A commit survives a crash of the process (the OS has the write), but the last
#   acknowledged commits can be lost on power loss or an OS crash. The database is never
#   corrupted either way.
# - `full`: every commit fsyncs the WAL before it is acknowledged, so an acknowledged commit
#   survives power loss too, at the price of one fsync per group commit.
# Nothing else is offered: `off` acknowledges what may never reach the disk, and `extra`
# adds nothing over `full` in WAL mode.
SQLITE_SYNCHRONOUS_MODES = ("normal", "full")
DEFAULT_SQLITE_SYNCHRONOUS = "normal"
SQLITE_SYNCHRONOUS_OPTION = "synchronous"


def validate_sqlite_synchronous(value: object) -> str:
    """`normal` or `full` (any case); anything else is a ValueError naming the option."""
    if isinstance(value, str) and value.strip().lower() in SQLITE_SYNCHRONOUS_MODES:
        return value.strip().lower()
    raise ValueError(
        f"SQLite option {SQLITE_SYNCHRONOUS_OPTION!r} must be one of "
        f"{', '.join(SQLITE_SYNCHRONOUS_MODES)}; got {value!r}"
    )


def sqlite_pragmas(synchronous: str = DEFAULT_SQLITE_SYNCHRONOUS) -> tuple[str, ...]:
    """The pragmas every SQLite connection of a store runs when it opens."""
    mode = validate_sqlite_synchronous(synchronous)
    return (
        # busy_timeout first: switching to WAL briefly needs the write lock.
        f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
        "PRAGMA journal_mode=WAL",
        f"PRAGMA synchronous={mode.upper()}",
        "PRAGMA foreign_keys=OFF",
        "PRAGMA case_sensitive_like=ON",
    )


SQLITE_PRAGMAS: tuple[str, ...] = sqlite_pragmas()

# The pragmas of each SQLite engine made by `create_engine` (the default ones for an engine
# made elsewhere), read by every connection the store opens: the pool's, the writer's and
# the loop lane's, so none of them runs with a weaker `synchronous` than the user chose.
_ENGINE_PRAGMAS: weakref.WeakKeyDictionary[sa.Engine, tuple[str, ...]] = weakref.WeakKeyDictionary()


def sqlite_pragmas_of(engine: AsyncEngine) -> tuple[str, ...]:
    return _ENGINE_PRAGMAS.get(engine.sync_engine, SQLITE_PRAGMAS)


SCHEMA_LOCK_KEY = _pg_options.SCHEMA_LOCK_KEY

_SQLITE_SYNC_DRIVERS = {"sqlite", "sqlite+pysqlite"}
_PG_SYNC_DRIVERS = {"postgresql", "postgres", "postgresql+psycopg2", "postgresql+pg8000"}


# ------------------------------------------------------------------ column types


def double_type() -> sa.types.TypeEngine[float]:
    """`num_value`: DOUBLE PRECISION on PostgreSQL, REAL on SQLite (both 8-byte floats)."""
    return sa.Double().with_variant(sa.REAL(), SQLITE)


def identity_pk_column(name: str) -> sa.Column[int]:
    """Autoincrement primary key: `INTEGER PRIMARY KEY AUTOINCREMENT` on SQLite (a rowid
    alias; the table needs `sqlite_autoincrement=True`), `BIGINT GENERATED ALWAYS AS IDENTITY`
    on PostgreSQL."""
    return sa.Column(
        name,
        sa.BigInteger().with_variant(sa.Integer(), SQLITE),
        sa.Identity(always=True),
        primary_key=True,
        nullable=False,
    )


# Rendered into the frozen DDL text of migrations (same meaning as the two helpers above).
def ddl_double(name: str) -> str:
    return "REAL" if name == SQLITE else "DOUBLE PRECISION"


def ddl_identity_pk(name: str) -> str:
    if name == SQLITE:
        return "INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT"
    return "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"


def ddl_now_ms(name: str) -> str:
    """SQL expression for the current time in epoch milliseconds (BIGINT)."""
    if name == SQLITE:
        return "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"


# ------------------------------------------------------------------ URLs and engines


def normalize_url(url: str | URL) -> URL:
    """Map a user URL onto the async driver durably uses for it.

    `sqlite:///rel.db`, `sqlite:////abs.db`, `sqlite://` (memory) → `sqlite+aiosqlite`;
    `postgresql://` / `postgres://` → `postgresql+asyncpg`. An explicit async driver is kept.
    """
    parsed = make_url(url) if isinstance(url, str) else url
    driver = parsed.drivername
    if driver in _SQLITE_SYNC_DRIVERS:
        return parsed.set(drivername="sqlite+aiosqlite")
    if driver in _PG_SYNC_DRIVERS:
        return parsed.set(drivername="postgresql+asyncpg")
    return parsed


def dialect_name_of(url: URL) -> str:
    backend = url.get_backend_name()
    if backend not in (SQLITE, POSTGRESQL):
        raise ValueError(f"unsupported database for the durably SQL store: {backend!r}")
    return backend


def is_memory_sqlite(url: URL) -> bool:
    if url.get_backend_name() != SQLITE:
        return False
    database = url.database or ""
    return database in ("", ":memory:") or url.query.get("mode") == "memory"


def _supports_skip_autocommit_rollback() -> bool:
    return "skip_autocommit_rollback" in inspect.signature(DefaultDialect.__init__).parameters


def default_engine_options(url: URL) -> dict[str, Any]:
    if url.get_backend_name() != SQLITE:
        return {}
    # DBAPI autocommit: a single statement is its own transaction (one round trip, no
    # BEGIN/COMMIT); multi-statement work issues BEGIN IMMEDIATE / COMMIT itself.
    options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"}
    if _supports_skip_autocommit_rollback():
        options["skip_autocommit_rollback"] = True
    if is_memory_sqlite(url):
        # One shared connection, so every session sees the same in-memory database.
        options["poolclass"] = StaticPool
    return options


def _refuse_blank_sqlite_option(url: str | URL) -> None:
    """SQLAlchemy drops a query parameter with no value (`?synchronous=`): refuse it rather
    than silently run the default the user did not ask for."""
    if not isinstance(url, str):
        return
    for key, value in parse_qsl(url.partition("?")[2], keep_blank_values=True):
        if key == SQLITE_SYNCHRONOUS_OPTION and not value.strip():
            validate_sqlite_synchronous(value)


def _split_sqlite_url(url: URL, engine_options: dict[str, Any]) -> tuple[URL, str]:
    """The URL without durably's SQLite option, and the `synchronous` mode it chose (the
    `synchronous=` keyword wins over the URL's `?synchronous=`). The option must not reach
    the driver: `sqlite3.connect` would refuse the unknown keyword."""
    chosen: object = DEFAULT_SQLITE_SYNCHRONOUS
    if SQLITE_SYNCHRONOUS_OPTION in url.query:
        chosen = url.query[SQLITE_SYNCHRONOUS_OPTION]
        if not isinstance(chosen, str):  # given twice: `?synchronous=a&synchronous=b`
            raise ValueError(
                f"SQLite option {SQLITE_SYNCHRONOUS_OPTION!r} is given more than once in the "
                f"URL: {list(chosen)!r}"
            )
        url = url.difference_update_query([SQLITE_SYNCHRONOUS_OPTION])
    if SQLITE_SYNCHRONOUS_OPTION in engine_options:
        chosen = engine_options.pop(SQLITE_SYNCHRONOUS_OPTION)
    return url, validate_sqlite_synchronous(chosen)


def install_sqlite_pragmas(
    engine: AsyncEngine, synchronous: str = DEFAULT_SQLITE_SYNCHRONOUS
) -> None:
    """Run the store's pragmas on every new DBAPI connection of `engine` (idempotent: the
    first call decides the engine's `synchronous`)."""
    if engine.dialect.name != SQLITE:
        return
    target = engine.sync_engine
    if target in _ENGINE_PRAGMAS:
        return
    pragmas = sqlite_pragmas(synchronous)
    _ENGINE_PRAGMAS[target] = pragmas

    def apply(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            for pragma in pragmas:
                cursor.execute(pragma)
        finally:
            cursor.close()

    event.listen(target, "connect", apply)


def create_engine(url: str | URL, **engine_options: Any) -> AsyncEngine:
    """An `AsyncEngine` for `url` with durably's defaults (caller options win).

    PostgreSQL: durably's options (`pg.OPTION_NAMES`: `schema`, `pool_size`,
    `statement_timeout`, …) are read from the URL's query string and from `engine_options`
    (keywords win) and turned into pool and asyncpg connect arguments; see `pg.py`.
    SQLite: `synchronous` (`normal`, the default, or `full`; see `SQLITE_SYNCHRONOUS_MODES`),
    from the URL's query string or the keyword (which wins).
    """
    normalized = normalize_url(url)
    name = dialect_name_of(normalized)
    if name == POSTGRESQL:
        require_postgres_driver("a PostgreSQL store")
        normalized, from_url = _pg_options.split_url(normalized)
        ours = {k: engine_options.pop(k) for k in list(engine_options) if k in _PG_ONLY}
        ours.update(
            {k: engine_options.pop(k) for k in _PG_SHARED if engine_options.get(k) is not None}
        )
        opts = from_url.merged(_pg_options.options_from(ours))
        options = _pg_options.merge_engine_options(_pg_options.engine_options(opts), engine_options)
        engine = create_async_engine(normalized, **options)
        _pg_options.install_liveness_check(engine)
        _pg_options.remember(engine, opts)
        return engine
    misplaced = sorted(k for k in engine_options if k in _PG_ONLY)
    if misplaced:
        raise TypeError(f"PostgreSQL-only option(s) for a {name} URL: {misplaced}")
    _refuse_blank_sqlite_option(url)
    normalized, synchronous = _split_sqlite_url(normalized, engine_options)
    options = default_engine_options(normalized)
    options.update(engine_options)
    engine = create_async_engine(normalized, **options)
    install_sqlite_pragmas(engine, synchronous)
    return engine


# durably's PostgreSQL options that SQLAlchemy does not know / that it knows (same meaning)
_PG_SHARED = frozenset(
    {"pool_size", "max_overflow", "pool_timeout", "pool_recycle", "pool_pre_ping"}
)
_PG_ONLY = frozenset(_pg_options.OPTION_NAMES) - _PG_SHARED


def sqlite_returning_supported() -> bool:
    return sqlite3.sqlite_version_info >= (3, 35, 0)


def sqlite_json_supported() -> bool:
    """JSON1 (`json_each`) is built in since SQLite 3.38 and in nearly every older build."""
    try:
        with closing(sqlite3.connect(":memory:")) as conn:
            conn.execute("SELECT value FROM json_each('[1]')").fetchall()
    except sqlite3.Error:
        return False
    return True


def offline_dialect(name: str) -> Dialect:
    """A SQLAlchemy dialect for rendering SQL without a connection."""
    factory: Any = _sqlite.dialect if name == SQLITE else _pg.dialect
    return cast(Dialect, factory())


# ------------------------------------------------------------------ per-dialect SQL


def _prefix_upper_bound(prefix: str) -> str | None:
    """Smallest string greater than every string starting with `prefix` (code-point order)."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if 0xD800 <= code <= 0xDFFF:
            code = 0xE000  # surrogates cannot be stored as UTF-8
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


class SqlDialect:
    """The SQL that differs between SQLite and PostgreSQL, for one engine."""

    def __init__(self, name: str, *, returning: bool | None = None) -> None:
        if name not in (SQLITE, POSTGRESQL):
            raise ValueError(f"unsupported database for the durably SQL store: {name!r}")
        self.name = name
        self.is_sqlite = name == SQLITE
        if returning is None:
            returning = sqlite_returning_supported() if self.is_sqlite else True
        #: `UPDATE/DELETE … RETURNING` (SQLite ≥ 3.35, PostgreSQL always).
        self.supports_returning = returning
        # SQLite compares TEXT with BINARY collation (= code-point order), so a range
        # predicate can use an index for prefix scans; PostgreSQL's default collation cannot.
        self.prefix_range = self.is_sqlite
        # SQLite passes variable-length lists as ONE JSON parameter (`json_each`), so the
        # statement text stays fixed (prebuilt, one driver call); PostgreSQL expands IN lists.
        self.json_lists = self.is_sqlite and sqlite_json_supported()
        #: lists bind as one parameter per member (SQLite without JSON1): chunk long ones
        self.expands_lists = self.is_sqlite and not self.json_lists

    # --- upsert

    def insert(self, table: sa.Table) -> Insert:
        if self.is_sqlite:
            return _sqlite.insert(table)
        return _pg.insert(table)

    def upsert(self, table: sa.Table, key_columns: Sequence[str]) -> Insert:
        """`INSERT … ON CONFLICT (keys) DO UPDATE SET every other column = excluded.column`."""
        keys = set(key_columns)
        stmt: Any = self.insert(table)
        excluded = stmt.excluded
        return stmt.on_conflict_do_update(  # type: ignore[no-any-return]
            index_elements=list(key_columns),
            set_={c.name: excluded[c.name] for c in table.c if c.name not in keys},
        )

    def insert_ignore(self, table: sa.Table, key_columns: Sequence[str]) -> Insert:
        stmt: Any = self.insert(table)
        return stmt.on_conflict_do_nothing(index_elements=list(key_columns))  # type: ignore[no-any-return]

    # --- variable-length IN lists with a fixed statement text

    def in_list(self, column: sa.ColumnElement[Any], name: str) -> sa.ColumnElement[bool]:
        """`column IN (<list bound as :name>)`; bind the value from `list_value`. SQLite: a
        JSON array through `json_each`; PostgreSQL: `= ANY(:name)` with an array."""
        if self.json_lists:
            members: sa.Select[Any] = sa.select(sa.literal_column("value")).select_from(
                sa.func.json_each(sa.bindparam(name, type_=sa.Text))
            )
            return column.in_(members)
        if not self.is_sqlite:
            return column == sa.any_(sa.bindparam(name, type_=_pg.ARRAY(column.type)))
        return column.in_(sa.bindparam(name, expanding=True))

    def list_value(self, values: Sequence[Any]) -> Any:
        return json.dumps(list(values)) if self.json_lists else list(values)

    def in_pairs(
        self, first: sa.ColumnElement[Any], second: sa.ColumnElement[Any], name: str
    ) -> sa.ColumnElement[bool]:
        """`(first, second) IN (<pairs bound as :name…>)`; bind from `pairs_params`. SQLite:
        a JSON array of pairs; PostgreSQL: two arrays zipped by `unnest`."""
        if self.json_lists:
            value: sa.ColumnClause[Any] = sa.literal_column("value")
            members = sa.select(
                sa.func.json_extract(value, "$[0]"), sa.func.json_extract(value, "$[1]")
            ).select_from(sa.func.json_each(sa.bindparam(name, type_=sa.Text)))
            return sa.tuple_(first, second).in_(members)
        if not self.is_sqlite:
            firsts = sa.bindparam(f"{name}_1", type_=_pg.ARRAY(first.type))
            seconds = sa.bindparam(f"{name}_2", type_=_pg.ARRAY(second.type))
            return sa.tuple_(first, second).in_(
                sa.select(sa.func.unnest(firsts), sa.func.unnest(seconds))
            )
        return sa.tuple_(first, second).in_(sa.bindparam(name, expanding=True))

    def pairs_params(self, name: str, pairs: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
        if self.json_lists:
            return {name: json.dumps([list(p) for p in pairs])}
        if not self.is_sqlite:
            return {f"{name}_1": [p[0] for p in pairs], f"{name}_2": [p[1] for p in pairs]}
        return {name: [tuple(p) for p in pairs]}

    # --- prefix matching: never LIKE (`_` and `%` in a prefix would be wildcards, and
    # LIKE is case-insensitive on SQLite)

    def prefix_params(self, prefix: str) -> tuple[bool, dict[str, Any]]:
        """(use the ranged statement?, bind parameters) for `prefix_predicate`."""
        params: dict[str, Any] = {"p": prefix, "plen": len(prefix)}
        if self.prefix_range and prefix:
            upper = _prefix_upper_bound(prefix)
            if upper is not None:
                params["p_hi"] = upper
                return True, params
        return False, params

    @staticmethod
    def prefix_predicate(column: sa.ColumnElement[str], *, ranged: bool) -> sa.ColumnElement[bool]:
        """`substr(col, 1, :plen) = :p` (exact, case-sensitive), plus an index-friendly
        `col >= :p AND col < :p_hi` range when `ranged` (see `prefix_params`)."""
        exact = sa.func.substr(column, 1, sa.bindparam("plen", type_=sa.Integer)) == sa.bindparam(
            "p", type_=sa.Text
        )
        if not ranged:
            return exact
        return sa.and_(
            column >= sa.bindparam("p", type_=sa.Text),
            column < sa.bindparam("p_hi", type_=sa.Text),
            exact,
        )

    @staticmethod
    def literal_prefix_predicate(
        column: sa.ColumnElement[str], prefix: str
    ) -> sa.ColumnElement[bool]:
        return sa.func.substr(column, 1, len(prefix)) == prefix

    # --- buffered signals

    def take_oldest_signal(self, table: sa.Table) -> sa.Executable:
        """`DELETE … WHERE id = (oldest id for :token) RETURNING payload`.

        PostgreSQL locks the picked row with `FOR UPDATE SKIP LOCKED` so two concurrent
        takers get two different rows instead of one of them finding nothing.
        """
        oldest = (
            sa.select(table.c.id)
            .where(table.c.token == sa.bindparam("token", type_=sa.Text))
            .order_by(table.c.id)
            .limit(1)
        )
        if not self.is_sqlite:
            oldest = oldest.with_for_update(skip_locked=True)
        return (
            sa.delete(table)
            .where(table.c.id == oldest.scalar_subquery())
            .returning(table.c.payload)
        )

    # --- schema lock (migrations)

    def schema_lock_statement(self, schema: str | None = None) -> str | None:
        """Run first inside the migration transaction (PostgreSQL: one advisory lock per
        schema, `durable_schema` when the schema is the connection's default); SQLite's
        `BEGIN IMMEDIATE` already holds the single write lock."""
        if self.is_sqlite:
            return None
        key = _pg_options.schema_lock_key(schema)
        return f"SELECT pg_advisory_xact_lock(hashtext('{key}'))"

    def create_schema_statement(self, schema: str | None) -> str | None:
        """`CREATE SCHEMA IF NOT EXISTS` for a configured PostgreSQL schema (under the lock)."""
        if self.is_sqlite or schema is None:
            return None
        return f'CREATE SCHEMA IF NOT EXISTS "{_pg_options.validate_schema(schema)}"'


__all__ = [
    "POSTGRESQL",
    "SQLITE",
    "SQLITE_PRAGMAS",
    "SQLITE_SYNCHRONOUS_MODES",
    "SqlDialect",
    "create_engine",
    "ddl_double",
    "ddl_identity_pk",
    "ddl_now_ms",
    "default_engine_options",
    "dialect_name_of",
    "double_type",
    "identity_pk_column",
    "install_sqlite_pragmas",
    "is_memory_sqlite",
    "normalize_url",
    "offline_dialect",
    "sqlite_json_supported",
    "sqlite_pragmas",
    "sqlite_pragmas_of",
    "sqlite_returning_supported",
    "validate_sqlite_synchronous",
]
