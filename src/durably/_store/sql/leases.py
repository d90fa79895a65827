"""Giving a lease back when the database is short of connections.

A lease release is the last write of a turn, and the engine's callers treat a failed one as
harmless ("the lease then simply expires") and log it at DEBUG. Harmless it is not: the run
then waits out its whole lease (`lease_ms`) before any engine picks it up again, and the cause
— a server with no room for another connection, a pool with none free — stays invisible. So
the store's release is retried here, on the failures where nothing was written (no
connection could be had, the connection died), and one that still fails is logged at ERROR,
once, naming the run and what happened; the lease is then left to lapse.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import sqlalchemy as sa

from durably._core.errors import StoreConnectionError
from durably._core.log_context import durably_logger

__all__ = ["RELEASE_RETRY_DELAYS_S", "release_retrying"]

log = durably_logger("durably.store")

#: Pauses between the attempts of a release (seconds): about 4 s in all, the time a pool
#: takes to free a connection under load, well below any lease.
RELEASE_RETRY_DELAYS_S: tuple[float, ...] = (0.05, 0.2, 0.5, 1.0, 2.0)


def _transient(error: BaseException) -> bool:
    """A failure that may pass: no connection (refused, full server, pool timeout), a
    connection lost, a database busy. A programming error or a constraint is not retried."""
    if isinstance(error, StoreConnectionError | TimeoutError | ConnectionError | OSError):
        return True
    if isinstance(error, sa.exc.DBAPIError):
        return bool(error.connection_invalidated) or isinstance(
            error, sa.exc.OperationalError | sa.exc.InterfaceError
        )
    return False


async def release_retrying(
    release: Callable[[], Awaitable[object]],
    run_id: str,
    *,
    delays: tuple[float, ...] | None = None,
) -> None:
    """Run `release()` until it succeeds or the retries are spent (then log at ERROR and
    return: the lease lapses). A non-transient error is raised as it is. `delays`: the
    pauses between attempts (`RELEASE_RETRY_DELAYS_S` when None, read at each call)."""
    if delays is None:
        delays = RELEASE_RETRY_DELAYS_S
    for attempt in range(len(delays) + 1):
        try:
            await release()
            if attempt:
                log.info("durably: released the lease of run %s at attempt %d", run_id, attempt + 1)
            return
        except Exception as error:
            if not _transient(error):
                raise
            if attempt == len(delays):
                log.error(
                    "durably: could not release the lease of run %s after %d attempts (%s: "
                    "%s); the lease is left to lapse, and the run is picked up again when it "
                    "expires (lease_ms)",
                    run_id,
                    attempt + 1,
                    type(error).__name__,
                    error,
                )
                return
            await asyncio.sleep(delays[attempt])
