"""`StatementRunner`: every SQL statement of one store runs, and is counted, here.

`SqlStateStore` is assembled from part objects (bulk operations, checkpoint aggregates, run
facets, start admission, the signal buffer), each in a module of its own. They all send
their statements the same way and the store's `statement_count` must count every one of
them, so the ways to send a statement live on this one object, which the store makes and
hands to each part; no part reaches into the store for them. A statement is counted once
however it runs (an `executemany` counts once; BEGIN/COMMIT are not counted), and the
statements of a group commit that is rolled back and run again are taken off (`rerun`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa

from durably._store.sql.connection import Connector, Session

Row = Sequence[Any]
T = TypeVar("T")


class StatementRunner:
    """Counted statement execution over one store's `Connector`."""

    def __init__(self, cx: Connector) -> None:
        self.cx = cx
        #: SQL statements executed so far (benchmarks divide it by the number of steps).
        self.statement_count = 0

    def rerun(self, statements: int) -> None:
        """`work` statements rolled back with a lost group commit, about to run again."""
        self.statement_count -= statements

    # ------------------------------------------------------------------ inside a transaction

    async def fetch(self, s: Session, stmt: sa.Executable, params: Any = None) -> Sequence[Row]:
        self.statement_count += 1
        return await s.fetch(stmt, params)

    async def run(self, s: Session, stmt: sa.Executable, params: Any = None) -> int:
        self.statement_count += 1
        return await s.execute(stmt, params)

    async def many(self, s: Session, stmt: sa.Executable, params: list[dict[str, Any]]) -> None:
        self.statement_count += 1
        await s.executemany(stmt, params)

    async def transaction(self, work: Callable[[Session], Awaitable[T]]) -> T:
        """`work` in ONE write transaction (its statements count through the methods
        above)."""
        result: T = await self.cx.write(work, tx=True)
        return result

    # ------------------------------------------------------------------ one statement alone

    async def write(self, stmt: sa.Executable, params: Any = None) -> int:
        """One statement on the write path (autocommitted by itself, or group-committed
        with other callers' on SQLite); affected rows."""
        self.statement_count += 1
        return await self.cx.execute(stmt, params)

    async def write_returning(self, stmt: sa.Executable, params: Any = None) -> Sequence[Row]:
        """One `… RETURNING` statement on the write path; every row it returned."""
        self.statement_count += 1
        return await self.cx.fetch(stmt, params, write=True)

    async def write_first(self, stmt: sa.Executable, params: Any = None) -> Row | None:
        """One `… RETURNING` statement on the write path; its first row."""
        found = await self.write_returning(stmt, params)
        return found[0] if found else None

    async def write_idempotent(self, stmt: sa.Executable, params: Any = None) -> None:
        """One idempotent write (an upsert), which the connector may share a round trip
        and a commit with other callers' (`Connector.execute_idempotent`)."""
        self.statement_count += 1
        await self.cx.execute_idempotent(stmt, params)

    async def read_all(
        self, stmt: sa.Executable, params: Any = None, *, point: bool = False
    ) -> Sequence[Row]:
        """One read statement. `point=True` for small indexed lookups (hot engine paths),
        which SQLite runs on the writer connection; scans and lists use the pool."""
        if point:
            self.statement_count += 1
            return await self.cx.fetch(stmt, params, write=False)

        async def work(s: Session) -> Sequence[Row]:
            return await self.fetch(s, stmt, params)

        return await self.cx.read(work)

    async def read_first(self, stmt: sa.Executable, params: Any = None) -> Row | None:
        found = await self.read_all(stmt, params, point=True)
        return found[0] if found else None

    async def read_scalar(
        self, stmt: sa.Executable, params: Any = None, *, point: bool = False
    ) -> int:
        found = await self.read_all(stmt, params, point=point)
        return int(found[0][0] or 0) if found else 0


__all__ = ["StatementRunner"]
