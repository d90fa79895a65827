"""Prebuilt statements compiled once to SQL text plus positional arguments
(`FastStatements`): the SQLite connector runs them on the aiosqlite connection in one thread
hop, and the asyncpg connector prepares them once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

__all__ = ["Compiled", "FastStatements"]


class Compiled:
    """One prebuilt statement's SQL text and how to order its parameters."""

    __slots__ = ("defaults", "names", "processors", "sql")

    def __init__(
        self,
        sql: str,
        names: Sequence[str],
        defaults: dict[str, Any],
        processors: dict[str, Callable[[Any], Any]],
    ) -> None:
        self.sql = sql
        self.names = tuple(names)
        self.defaults = defaults
        # SQLAlchemy's bind processors (e.g. `to_float` for REAL), applied like it would.
        self.processors = processors

    def args(self, params: dict[str, Any] | None) -> list[Any]:
        values = params or {}
        defaults = self.defaults
        out = [values[n] if n in values else defaults[n] for n in self.names]
        if self.processors:
            for i, name in enumerate(self.names):
                proc = self.processors.get(name)
                if proc is not None and out[i] is not None:
                    out[i] = proc(out[i])
        return out


class FastStatements:
    """SQLite fast path for the store's prebuilt statements.

    SQLAlchemy's aiosqlite adapter spends four thread hops per statement (cursor, execute,
    fetch, close). For statements the store builds once (`register`), we compile them once per
    parameter-key set with SQLAlchemy and run the SQL text directly on the aiosqlite
    connection SQLAlchemy hands out: ONE hop (`execute` / `execute_fetchall` /
    `executemany`). A statement that needs SQLAlchemy at execution time (expanding IN lists,
    bind processors) is detected at compile time and keeps the regular path, as do dynamic
    statements (list filters) that are never registered.
    """

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._registered: dict[int, sa.Executable] = {}
        self._cache: dict[tuple[int, tuple[str, ...], bool], Compiled | None] = {}

    def register(self, *stmts: sa.Executable | None) -> None:
        for stmt in stmts:
            if stmt is not None:
                self._registered[id(stmt)] = stmt

    def compiled(
        self, stmt: sa.Executable, params: dict[str, Any] | None, many: bool = False
    ) -> Compiled | None:
        if id(stmt) not in self._registered:
            return None
        # Keyed by the parameter names in the caller's order (one hot-path call per step:
        # no sort); another order of the same names compiles the same statement once more.
        cache_key = (id(stmt), tuple(params) if params else (), many)
        try:
            return self._cache[cache_key]
        except KeyError:
            pass
        keys = tuple(sorted(params)) if params else ()
        compiled: Any = stmt.compile(  # type: ignore[attr-defined]
            dialect=self._dialect, column_keys=list(keys), for_executemany=many
        )
        entry: Compiled | None = None
        names = compiled.positiontup
        processors: Any = getattr(compiled, "_bind_processors", None)
        eligible = (
            names is not None
            and isinstance(processors, Mapping)
            and "POSTCOMPILE" not in compiled.string
            and not compiled.literal_execute_params
            and not compiled.post_compile_params
        )
        if eligible:
            entry = Compiled(compiled.string, names, dict(compiled.params), dict(processors))
        self._cache[cache_key] = entry
        return entry
