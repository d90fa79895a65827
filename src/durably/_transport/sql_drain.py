"""The SQL transport's result drain: claimed result rows into the engine's `ResultSink`.

Result rows are written by workers in any language, by an older SDK, or by anyone who can
write to the table: each row is untrusted. The drain's one promise is that no row can stop
the rows behind it from being settled:

- **A row that cannot be read** (`output` or `error` not JSON, over `max_payload_bytes`,
  nested too deep, holding NaN/Infinity or a lone surrogate; `started_at` not an epoch-ms
  time; a wrong `status`; ids that disagree) is logged once with its ids. When it names its
  step consistently (`step_id` = `run_id:seq`) it is replaced by a failed, non-retryable
  attempt of that step (code `malformed_result`, the problem as the message), so the run does
  not wait forever for a result that will never come; otherwise it is deleted.
- **A batch the sink refuses** is, unless the refusal is an outage, delivered again one row
  at a time: the rows the sink takes are settled and deleted at once. A row the sink refuses
  on its own is kept for the next poll up to `_MAX_REFUSALS` times (a passing fault gets its
  retries), then replaced by a failed attempt of its step (code `malformed_result`) and,
  should even that be refused, deleted with an error naming it.
- **An outage** (the store or this database cannot be reached: connection errors, timeouts,
  a lost or invalidated connection) is not the row's fault: the claimed rows are released
  and the drain backs off, retrying until the store is back, however long that takes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import suppress
from typing import Any, Final

import sqlalchemy as sa

from durably._core.errors import StoreConnectionError
from durably._core.log_context import durably_logger
from durably._core.models import StepError
from durably._core.wire import StepResult
from durably._store.protocol import StateStoreUnavailable
from durably._transport.protocol import ResultSink, TransportUnavailableError
from durably._transport.sql_tables import (
    MALFORMED_RESULT,
    Connect,
    SqlSettings,
    now_ms,
    result_of_row,
    stand_in_for,
)

try:
    import asyncpg  # type: ignore[import-untyped]
except ModuleNotFoundError:  # the `postgres` extra is not installed
    asyncpg = None

log = durably_logger("durably.transport.sql")

__all__ = ["ResultDrain", "is_outage"]

#: A failing poll backs off from `poll_ms` doubling up to this (seconds).
_MAX_BACKOFF_S: Final = 5.0
#: How often the sink may refuse one row on its own before the row counts as unstorable.
_MAX_REFUSALS: Final = 3
#: Rows remembered (refusal counts, rows already reported): bounded, a hostile writer could
#: otherwise grow them without end; forgetting only means a row is logged once more.
_MEMORY: Final = 10_000

# Errors of the value rather than of the connection, wherever they sit in the chain: a row
# whose content makes the store's encoder or the database refuse it is refused every time.
_DATA_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, OverflowError)
if asyncpg is not None:
    _DATA_ERRORS += (asyncpg.DataError,)
_OUTAGES: tuple[type[BaseException], ...] = (
    OSError,  # ConnectionError and TimeoutError among them
    StoreConnectionError,
    StateStoreUnavailable,
    TransportUnavailableError,
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    sa.exc.DisconnectionError,
    sa.exc.TimeoutError,
)
if asyncpg is not None:
    _OUTAGES += (asyncpg.PostgresConnectionError, asyncpg.InterfaceError)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    item: BaseException | None = exc
    while item is not None and item not in seen and len(seen) < 16:
        seen.append(item)
        orig = getattr(item, "orig", None)  # SQLAlchemy's wrapped DBAPI error
        if isinstance(orig, BaseException) and orig not in seen:
            seen.append(orig)
        item = item.__cause__ or item.__context__
    return seen


def is_outage(exc: BaseException) -> bool:
    """True when `exc` says the store (or the database) could not be reached, so retrying
    the same rows later is right; False for an error of the data itself, or any other."""
    chain = _chain(exc)
    if any(isinstance(e, _DATA_ERRORS) and not isinstance(e, OSError) for e in chain):
        return False
    return any(
        isinstance(e, _OUTAGES) or (isinstance(e, sa.exc.DBAPIError) and e.connection_invalidated)
        for e in chain
    )


class _Bounded:
    """A dict of at most `_MEMORY` entries (the oldest forgotten first)."""

    def __init__(self) -> None:
        self.items: dict[Any, int] = {}

    def put(self, key: Any, value: int) -> None:
        if key not in self.items and len(self.items) >= _MEMORY:
            self.items.pop(next(iter(self.items)))
        self.items[key] = value


class ResultDrain:
    """Claims result rows, settles them through the sink, deletes them (module docstring).

    `connect` lends the transport's connections, `settings` are the transport's, and `wake` is
    set by the transport whenever a result row may have arrived (a NOTIFY, a reconnect, the
    close); `max_bytes` bounds each JSON column of a row."""

    def __init__(
        self,
        connect: Connect,
        settings: SqlSettings,
        wake: asyncio.Event,
        sink: ResultSink,
        max_bytes: int,
    ):
        self._connect = connect
        self._settings = settings
        self._wake = wake
        self._stopping = False
        self._sink = sink
        self._max_bytes = max_bytes
        self._refusals = _Bounded()  # step id -> refusals of its row on its own
        self._reported = _Bounded()  # (step id, created_at) of malformed rows already logged

    def stop(self) -> None:
        """Claim no batch after the one under way (the transport is closing)."""
        self._stopping = True

    async def loop(self) -> None:
        poll_s = self._settings.poll_s
        failures = 0
        while not self._stopping:
            self._wake.clear()
            try:
                claimed = await self.once()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = min(poll_s * 2 ** (failures - 1), _MAX_BACKOFF_S)
                log.warning("SQL transport: result drain failed (%s); retry in %.2fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            if claimed == 0:
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), poll_s)

    async def once(self) -> int:
        """Claim, read, deliver, acknowledge one batch; the number of rows claimed."""
        settings = self._settings
        stamp = now_ms()
        async with self._connect("claiming step results") as conn:
            rows = await conn.fetch(
                settings.sql.claim_results,
                stamp - settings.lease_ms,
                settings.batch_size,
                settings.instance_id,
                stamp,
            )
        if not rows:
            return 0
        rows = sorted(rows, key=lambda row: (row["created_at"], row["step_id"]))
        results: list[StepResult] = []
        removed: list[str] = []
        for row in rows:
            try:
                results.append(result_of_row(row, max_bytes=self._max_bytes))
            except Exception as exc:  # any failure to read: this row, never the drain
                stand_in = self._malformed(row, exc)
                if stand_in is None:
                    removed.append(row["step_id"])
                else:
                    results.append(stand_in)
        if removed:
            try:
                await self._ack(removed, stamp, "deleting malformed step results")
            except TransportUnavailableError as exc:  # they come again after the lease
                log.warning("SQL transport: %s", exc)
        if results:
            await self._deliver(results, stamp)
        return len(rows)

    def _malformed(self, row: Any, exc: Exception) -> StepResult | None:
        """Log an unreadable row once and give what replaces it (None: delete it)."""
        step_id = row["step_id"]
        stand_in = stand_in_for(row, f"malformed step result row: {exc}")
        key = (step_id, row["created_at"])
        if key in self._reported.items:
            log.debug("SQL transport: malformed result row for step %r again", step_id)
        else:
            self._reported.put(key, 1)
            log.error(
                "SQL transport: malformed result row for step %r (run %r, seq %r): %s; %s "
                "(row: %.500s)",
                step_id,
                row["run_id"],
                row["seq"],
                exc,
                "its step fails instead" if stand_in is not None else "deleted",
                dict(row),
            )
        return stand_in

    async def _ack(self, step_ids: Sequence[str], stamp: int, doing: str) -> None:
        sql, me = self._settings.sql, self._settings.instance_id
        async with self._connect(doing) as conn:
            await conn.execute(sql.ack_results, list(step_ids), me, stamp)

    async def _release(self, step_ids: Sequence[str], stamp: int) -> None:
        """Kept for the next poll instead of waiting out the lease."""
        sql, me = self._settings.sql, self._settings.instance_id
        with suppress(Exception):
            async with self._connect("releasing step results") as conn:
                await conn.execute(sql.release_results, list(step_ids), me, stamp)

    async def _settled(self, step_ids: Sequence[str], stamp: int) -> None:
        for step_id in step_ids:
            self._refusals.items.pop(step_id, None)
        try:
            await self._ack(step_ids, stamp, "acknowledging step results")
        except TransportUnavailableError as exc:
            # Applied already: the rows come again after the lease, duplicates are harmless.
            log.warning("SQL transport: %s", exc)

    async def _deliver(self, results: list[StepResult], stamp: int) -> None:
        ids = [result.step_id for result in results]
        try:
            await self._sink.step_results(results)
        except Exception as exc:
            if is_outage(exc):
                await self._release(ids, stamp)
                raise
            if len(results) == 1:
                if await self._refused(results[0], exc, stamp):
                    await self._settled(ids, stamp)
                return
            log.warning(
                "SQL transport: the sink refused a batch of %d results (%s: %s); delivering "
                "them one at a time",
                len(results),
                type(exc).__name__,
                exc,
            )
            await self._one_by_one(results, stamp)
            return
        except BaseException:
            await self._release(ids, stamp)
            raise
        await self._settled(ids, stamp)

    async def _one_by_one(self, results: list[StepResult], stamp: int) -> None:
        """Each result on its own, so that one the sink cannot take holds back no other."""
        done: list[str] = []
        try:
            for at, result in enumerate(results):
                try:
                    await self._sink.step_results([result])
                except Exception as exc:
                    if is_outage(exc):
                        await self._release([r.step_id for r in results[at:]], stamp)
                        raise
                    if await self._refused(result, exc, stamp):
                        done.append(result.step_id)
                    continue
                except BaseException:
                    await self._release([r.step_id for r in results[at:]], stamp)
                    raise
                done.append(result.step_id)
        finally:
            if done:
                await self._settled(done, stamp)

    async def _refused(self, result: StepResult, exc: Exception, stamp: int) -> bool:
        """The sink refused `result` on its own, not for an outage. Kept for another try
        (False) until it was refused `_MAX_REFUSALS` times; then its step fails instead, or
        the row is deleted when even that is refused (True: the row is to be deleted)."""
        step_id = result.step_id
        count = self._refusals.items.get(step_id, 0) + 1
        problem = f"{type(exc).__name__}: {exc}"
        if count < _MAX_REFUSALS:
            self._refusals.put(step_id, count)
            log.warning(
                "SQL transport: the sink refused the result of step %r (%s); try %d of %d",
                step_id,
                problem,
                count,
                _MAX_REFUSALS,
            )
            await self._release([step_id], stamp)
            return False
        self._refusals.items.pop(step_id, None)
        stand_in: StepResult | None = None
        if result.error is None or result.error.code != MALFORMED_RESULT:
            error = StepError(
                message=f"step result could not be stored: {problem}"[:2000],
                code=MALFORMED_RESULT,
                retryable=False,
            )
            stand_in = StepResult(result.run_id, result.seq, step_id, "failed", error=error)
        if stand_in is not None:
            log.error(
                "SQL transport: the result of step %r (run %r) cannot be stored (%s); its step "
                "fails instead",
                step_id,
                result.run_id,
                problem,
            )
            try:
                await self._sink.step_results([stand_in])
                return True
            except Exception as again:
                if is_outage(again):
                    await self._release([step_id], stamp)
                    raise
                problem = f"{type(again).__name__}: {again}"
        log.error(
            "SQL transport: deleting the result row of step %r (run %r): nothing of it can be "
            "stored (%s)",
            step_id,
            result.run_id,
            problem,
        )
        return True
