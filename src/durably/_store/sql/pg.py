"""PostgreSQL specifics of the SQL store: URL options, engine options, connection liveness.

durably reads its own options from the query string of a `postgresql://` URL (and from
keywords of `SqlStateStore.from_url`, which win) and removes them before the URL reaches
asyncpg:

==================  ===============================================================  =========
option              meaning                                                          default
==================  ===============================================================  =========
schema              PostgreSQL schema holding the tables (connections get            (server's
                    `search_path=<schema>`; `ensure_schema` creates it)               default)
pool_budget         the most connections this process's store opens to the server:   23
                    the statement pool plus 3 dedicated ones (see "Connection
                    budget"); sizes the pool when `pool_size`/`max_overflow` are
                    left out
pool_size           connections kept open in the pool                                10
max_overflow        extra connections opened under load beyond `pool_size`           10
pool_timeout        seconds to wait for a free pooled connection                     30
pool_recycle        seconds after which a pooled connection is replaced (-1: never)  -1
pool_pre_ping       `true`: ping every connection at checkout (one extra round       false
                    trip per store call; see "Reconnection")
statement_timeout   server-side `statement_timeout` in milliseconds (0: none)        0
connect_timeout     seconds to establish a connection                                10
command_timeout     client-side timeout of one statement in seconds (asyncpg)        none
application_name    `application_name` of the connections                           durably
synchronous_commit  server `synchronous_commit` (`off` trades the last few hundred      (server's)
                    ms of commits on a server crash for ~5x faster single commits)
==================  ===============================================================  =========

Reconnection: every checkout first asks asyncpg whether the connection is still open — free,
no round trip (`is_closed()`; asyncpg notices a server-closed socket on the event loop) — and
silently replaces one the server closed (restart, `pg_terminate_backend`). A statement in
flight when the server goes away fails with SQLAlchemy's `DBAPIError`
(`connection_invalidated=True`); the pool is then invalidated and the next call reconnects.
`pool_pre_ping=true` additionally catches silently dropped connections (a network partition),
at the price of a round trip per call.

Connection budget: one process's store opens at most `pool_budget` connections — the
statement pool (`pool_size` kept open, up to `max_overflow` more under load) plus up to
`DEDICATED_CONNECTIONS` (3) held for the process's life: the wake bus's LISTEN, the
flow-control LISTEN (queues counted in the store) and the instance hold (`instance_id=`). With
`pool_budget=N` alone, the pool gets `N - 3` connections (`pool_size` the smaller of 10 and
that); with `pool_size`/`max_overflow` too, they must fit in `N - 3` (else ValueError). Without
it the budget is what the pool options add up to (23 by default). A fleet needs the sum of its
processes' budgets (plus a SQL transport's own pool) below the server's `max_connections`
less its reserved connections: five processes at the defaults need 115 of a default server's
100. At open the store compares its budget with what the server has left for it
(`max_connections`, the role's and the database's `CONNECTION LIMIT`, the connections in use)
and logs a WARNING when the budget does not fit. A server that refuses a new connection for
lack of room ("too many clients", a role's connection limit) does not fail a statement while
the pool has connections of its own: it waits for one of them (up to `pool_timeout`).

Connect failures: a connection the store cannot open raises `StoreConnectionError` (a
`ConnectionError`; `StoreConnectTimeoutError`, also a `TimeoutError`, for a timeout) whose
message names host:port and what failed — refused, unknown host, no TCP connection or no
answer to the PostgreSQL handshake within `connect_timeout`, or the server's own refusal
(role, password, database, too many clients). asyncpg alone says little: a server that
accepts TCP and never answers gives a `TimeoutError` with no text at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import socket
import weakref
from collections.abc import Awaitable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from durably._core.errors import StoreConnectionError, StoreConnectTimeoutError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

DEFAULT_POOL_SIZE = 10
DEFAULT_MAX_OVERFLOW = 10
#: Connections a store holds apart from its statement pool, for the process's life: the wake
#: bus's LISTEN, the flow-control LISTEN and the instance hold.
DEDICATED_CONNECTIONS = 3
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_APPLICATION_NAME = "durably"
CHANNEL_PREFIX = "durable_wake_"
SCHEMA_LOCK_KEY = "durable_schema"


@dataclass(slots=True)
class PgOptions:
    """durably's PostgreSQL options (see the module docstring); None = the default."""

    schema: str | None = None
    pool_budget: int | None = None
    pool_size: int | None = None
    max_overflow: int | None = None
    pool_timeout: float | None = None
    pool_recycle: int | None = None
    pool_pre_ping: bool | None = None
    statement_timeout: int | None = None
    connect_timeout: float | None = None
    command_timeout: float | None = None
    application_name: str | None = None
    synchronous_commit: str | None = None

    def merged(self, other: PgOptions) -> PgOptions:
        """`other`'s set fields win over ours."""
        out = PgOptions()
        for name in self.__slots__:
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(out, name, theirs if theirs is not None else mine)
        return out


_PARSERS: dict[str, Any] = {
    "schema": str,
    "pool_budget": int,
    "pool_size": int,
    "max_overflow": int,
    "pool_timeout": float,
    "pool_recycle": int,
    "pool_pre_ping": "bool",
    "statement_timeout": int,
    "connect_timeout": float,
    "command_timeout": float,
    "application_name": str,
    "synchronous_commit": str,
}
OPTION_NAMES: tuple[str, ...] = tuple(_PARSERS)


def _parse(name: str, raw: Any) -> Any:
    kind = _PARSERS[name]
    if isinstance(raw, tuple | list):
        raw = raw[-1]
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError(f"invalid boolean for {name!r}: {raw!r}")
    try:
        value = kind(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid value for {name!r}: {raw!r}") from exc
    if name == "schema":
        validate_schema(value)
    return value


def validate_schema(schema: str) -> str:
    """Schema names are plain identifiers (letters, digits, `_`; at most 63 characters)."""
    if not _IDENT.match(schema):
        raise ValueError(
            f"invalid PostgreSQL schema name {schema!r}: use letters, digits and '_' "
            "(not starting with a digit), at most 63 characters"
        )
    return schema


def options_from(values: dict[str, Any]) -> PgOptions:
    """Parse durably's options (strings from a URL, or typed keywords); unknown keys raise."""
    unknown = set(values) - set(_PARSERS)
    if unknown:
        raise TypeError(f"unknown PostgreSQL option(s): {sorted(unknown)}")
    return PgOptions(**{k: _parse(k, v) for k, v in values.items() if v is not None})


def split_url(url: URL) -> tuple[URL, PgOptions]:
    """`url` without durably's query parameters, and those parameters parsed."""
    mine = {k: v for k, v in url.query.items() if k in _PARSERS}
    if not mine:
        return url, PgOptions()
    return url.difference_update_query(list(mine)), options_from(mine)


@dataclass(frozen=True, slots=True)
class Budget:
    """How many connections one process's store may open (see "Connection budget")."""

    total: int  # the statement pool's most plus the dedicated connections
    pool_max: int  # the statement pool: at most this many open
    pool_keep: int  # ... of which this many stay open when idle


def budget_of(opts: PgOptions) -> Budget:
    """The connection budget `opts` describe; ValueError for one the pool cannot fit in."""
    size, overflow, budget = opts.pool_size, opts.max_overflow, opts.pool_budget
    for name, value in (("pool_size", size), ("max_overflow", overflow)):
        if value is not None and value < 0:
            raise ValueError(f"PostgreSQL option {name}={value} must be >= 0")
    if budget is None:
        keep = DEFAULT_POOL_SIZE if size is None else size
        most = keep + (DEFAULT_MAX_OVERFLOW if overflow is None else overflow)
        return Budget(most + DEDICATED_CONNECTIONS, max(most, 1), max(keep, 1))
    room = budget - DEDICATED_CONNECTIONS
    if room < 1:
        raise ValueError(
            f"PostgreSQL option pool_budget={budget} leaves no connection for statements: "
            f"{DEDICATED_CONNECTIONS} are dedicated (wake bus, flow control, instance hold), "
            f"so give at least {DEDICATED_CONNECTIONS + 1}"
        )
    keep = min(DEFAULT_POOL_SIZE, room) if size is None else size
    most = room if overflow is None else keep + overflow
    if most > room or keep > room:
        raise ValueError(
            f"PostgreSQL options pool_size={keep} + max_overflow={most - keep} do not fit in "
            f"pool_budget={budget} ({DEDICATED_CONNECTIONS} of it dedicated, {room} left for "
            "the statement pool): raise pool_budget or lower them"
        )
    return Budget(budget, max(most, 1), max(keep, 1))


def engine_options(opts: PgOptions) -> dict[str, Any]:
    """`create_async_engine` keywords for `opts` (pool sizing, asyncpg connect arguments)."""
    budget = budget_of(opts)
    server_settings: dict[str, str] = {
        "application_name": opts.application_name or DEFAULT_APPLICATION_NAME
    }
    if opts.schema is not None:
        server_settings["search_path"] = f'"{opts.schema}"'
    if opts.statement_timeout is not None:
        server_settings["statement_timeout"] = str(int(opts.statement_timeout))
    if opts.synchronous_commit is not None:
        server_settings["synchronous_commit"] = opts.synchronous_commit
    connect_args: dict[str, Any] = {
        "server_settings": server_settings,
        "timeout": opts.connect_timeout
        if opts.connect_timeout is not None
        else DEFAULT_CONNECT_TIMEOUT_S,
    }
    if opts.command_timeout is not None:
        connect_args["command_timeout"] = opts.command_timeout
    out: dict[str, Any] = {
        "connect_args": connect_args,
        # SQLAlchemy's own pool only opens connections for the store's pool and its dedicated
        # ones (each detached once open) and runs the migrations: sized from the same budget.
        "pool_size": budget.pool_keep,
        "max_overflow": budget.pool_max - budget.pool_keep,
        "pool_pre_ping": bool(opts.pool_pre_ping),
    }
    if opts.pool_timeout is not None:
        out["pool_timeout"] = opts.pool_timeout
    if opts.pool_recycle is not None:
        out["pool_recycle"] = opts.pool_recycle
    return out


def merge_engine_options(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Caller keywords win; `connect_args` and its `server_settings` are merged key by key."""
    out = {**ours, **theirs}
    if "connect_args" in ours and "connect_args" in theirs:
        args = {**ours["connect_args"], **theirs["connect_args"]}
        ss_ours = ours["connect_args"].get("server_settings") or {}
        ss_theirs = theirs["connect_args"].get("server_settings") or {}
        if ss_ours or ss_theirs:
            args["server_settings"] = {**ss_ours, **ss_theirs}
        out["connect_args"] = args
    return out


# ------------------------------------------------------------------ per-engine facts

_OPTIONS: weakref.WeakKeyDictionary[sa.Engine, PgOptions] = weakref.WeakKeyDictionary()


def remember(engine: AsyncEngine, opts: PgOptions) -> None:
    """Record the options an engine was made with by durably's `create_engine`."""
    _OPTIONS[engine.sync_engine] = opts


def options_of(engine: AsyncEngine) -> PgOptions | None:
    return _OPTIONS.get(engine.sync_engine)


def schema_of(engine: AsyncEngine) -> str | None:
    """The schema an engine made by durably's `create_engine` was configured with."""
    opts = _OPTIONS.get(engine.sync_engine)
    return opts.schema if opts is not None else None


def _driver_of(dbapi_connection: Any) -> Any:
    driver = getattr(dbapi_connection, "driver_connection", None)
    return driver if driver is not None else getattr(dbapi_connection, "_connection", None)


def _check_alive(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    driver = _driver_of(dbapi_connection)
    is_closed = getattr(driver, "is_closed", None)
    if is_closed is not None and is_closed():
        # The pool discards this connection and checks out (or opens) another one.
        raise sa.exc.DisconnectionError("connection closed by the server")


def install_liveness_check(engine: AsyncEngine) -> None:
    """Replace server-closed connections at checkout, without a round trip (idempotent)."""
    target = engine.sync_engine
    if not event.contains(target, "checkout", _check_alive):
        event.listen(target, "checkout", _check_alive)


# ------------------------------------------------------------------ connect errors

T = TypeVar("T")

#: How long the diagnosis of a connect timeout waits for a bare TCP connection (seconds).
_PROBE_S = 2.0


def connect_target(engine: AsyncEngine) -> tuple[str, int]:
    """The host (or socket directory) and port an engine connects to, as asyncpg defaults
    them when the URL leaves them out."""
    url = engine.url
    host = url.host or url.query.get("host") or "localhost"
    if isinstance(host, tuple | list):
        host = ",".join(host)
    return str(host), int(url.port or 5432)


def _timeout_of(engine: AsyncEngine) -> tuple[float | None, str]:
    """The connect timeout in seconds (None: unknown) and how to change it."""
    opts = _OPTIONS.get(engine.sync_engine)
    if opts is None:
        return None, (
            "the limit is the connect timeout of the engine you passed (asyncpg's `timeout` "
            "connect argument, 60 s unless set)"
        )
    seconds = opts.connect_timeout if opts.connect_timeout is not None else None
    seconds = DEFAULT_CONNECT_TIMEOUT_S if seconds is None else seconds
    return seconds, (
        f"the limit is the connect_timeout option ({seconds:g} s): raise it with "
        "?connect_timeout=SECONDS in the store URL (or connect_timeout= of "
        "SqlStateStore.from_url)"
    )


async def _tcp_answers(host: str, port: int, within: float) -> bool | None:
    """Whether a bare TCP connection to host:port opens within `within` seconds (None: it
    failed otherwise, or the target is a Unix socket). Only used to explain a timeout."""
    if host.startswith("/") or "," in host:
        return None
    try:
        async with asyncio.timeout(within):
            _reader, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return False
    except OSError:
        return None
    writer.close()
    with suppress(Exception):
        await writer.wait_closed()
    return True


def driver_error(error: BaseException) -> BaseException | None:
    """The asyncpg exception behind `error` (SQLAlchemy wraps it once or twice), if any."""
    seen: Any = error
    for _ in range(4):
        if seen is None:
            return None
        if type(seen).__module__.startswith("asyncpg"):
            return seen  # type: ignore[no-any-return]
        seen = seen.__cause__ or getattr(seen, "orig", None)
    return None


def _is_server_error(error: BaseException) -> bool:
    """PostgreSQL itself answered with an error (bad role, password or database, too many
    connections, starting up, ...), as opposed to a failure of the driver or the network."""
    return any(cls.__name__ == "PostgresError" for cls in type(error).__mro__)


async def explain_connect_error(
    engine: AsyncEngine, error: BaseException
) -> StoreConnectionError | None:
    """A `StoreConnectionError` naming host:port and what failed, for an error raised while
    opening a connection; None when `error` is not a connection failure (raise it as is).

    The driver's own errors say little: a server that accepts TCP and never answers gives a
    `TimeoutError` without any text, and a refused port does not say which store it was."""
    if isinstance(error, StoreConnectionError):
        return None
    host, port = connect_target(engine)
    where = f"{host}:{port}"
    url = engine.url
    if isinstance(error, TimeoutError):
        seconds, how = _timeout_of(engine)
        within = f" within {seconds:g} s" if seconds is not None else ""
        probe = min(seconds, _PROBE_S) if seconds is not None else _PROBE_S
        tcp = await _tcp_answers(host, port, probe)
        if tcp is True:
            what = (
                f"the server accepted the TCP connection but did not answer the PostgreSQL "
                f"handshake{within} (is PostgreSQL listening on that port, and is it not "
                "overloaded?)"
            )
        elif tcp is False:
            what = (
                f"no TCP connection{within} (the host is down or unreachable, or a firewall "
                "drops the packets)"
            )
        else:
            what = f"connecting and the PostgreSQL handshake did not complete{within}"
        return StoreConnectTimeoutError(
            f"cannot connect to PostgreSQL at {where}: {what}; {how}", host=host, port=port
        )
    if isinstance(error, socket.gaierror):
        return StoreConnectionError(
            f"cannot connect to PostgreSQL at {where}: the host name {host!r} could not be "
            f"resolved ({error.strerror or error}); check the host in the store URL",
            host=host,
            port=port,
        )
    if isinstance(error, ConnectionRefusedError):
        return StoreConnectionError(
            f"cannot connect to PostgreSQL at {where}: connection refused (nothing listens "
            f"on port {port} of {host}: is PostgreSQL running, and is the port right?)",
            host=host,
            port=port,
        )
    driver = driver_error(error)
    if driver is not None and _is_server_error(driver):
        return StoreConnectionError(
            f"PostgreSQL at {where} refused the connection of user {url.username!r} to "
            f"database {url.database!r}: {driver}",
            host=host,
            port=port,
        )
    failure = driver if driver is not None else error
    if isinstance(failure, OSError) or driver is not None:
        text = str(failure) or type(failure).__name__
        return StoreConnectionError(
            f"cannot connect to PostgreSQL at {where}: {text} ({type(failure).__name__}; "
            "is it a PostgreSQL server, and do its SSL settings match the URL's?)",
            host=host,
            port=port,
        )
    return None


async def connecting(engine: AsyncEngine, opening: Awaitable[T]) -> T:
    """Await `opening` (a new connection of `engine`), turning a connection failure into a
    `StoreConnectionError` that names host:port and what failed (`explain_connect_error`)."""
    try:
        return await opening
    except Exception as error:
        explained = await explain_connect_error(engine, error)
        if explained is None:
            raise
        raise explained from error


# ------------------------------------------------------------------ names


def wake_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of the tables in `schema` (at most 63 bytes)."""
    name = CHANNEL_PREFIX + schema
    if len(name.encode()) <= 63:
        return name
    return CHANNEL_PREFIX + hashlib.sha1(schema.encode()).hexdigest()[:16]


def schema_lock_key(schema: str | None) -> str:
    """Key (hashed with `hashtext`) of the migration advisory lock: one per schema."""
    return SCHEMA_LOCK_KEY if schema is None else f"{SCHEMA_LOCK_KEY}:{schema}"


__all__ = [
    "DEDICATED_CONNECTIONS",
    "OPTION_NAMES",
    "Budget",
    "PgOptions",
    "budget_of",
    "connect_target",
    "connecting",
    "driver_error",
    "engine_options",
    "explain_connect_error",
    "install_liveness_check",
    "merge_engine_options",
    "options_from",
    "options_of",
    "remember",
    "schema_lock_key",
    "schema_of",
    "split_url",
    "validate_schema",
    "wake_channel",
]
