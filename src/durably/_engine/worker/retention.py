"""`RetentionSweeper`: the engine's background retention sweep (`Engine(retention=[...])`).

Only a driving engine sweeps, and of all the engines on one store only the one holding the
store's `RETENTION_HOLD` does: the hold is the same one-live-process lock that guards an
engine instance id (`hold_instance`: a PostgreSQL advisory lock, a file lock next to a
SQLite file), so two engines never delete the same rows at once and a crashed sweeper's hold
is freed by the database or the kernel. An engine without the hold tries again at each
interval. A sweep runs at open and then every `interval_ms` (0: at open only); sweeps never
overlap, and each policy is one `prune` (at most `max_batches` batches). A sweep that fails
is logged and retried at the next interval; the runs being driven never depend on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol

from durably._core.log_context import durably_logger
from durably._core.retention import PruneResult, RetentionPolicy
from durably._engine.control.retention import prune
from durably._store.protocol import InstanceHold, LeaseStore, RetentionStore

__all__ = ["RETENTION_HOLD", "RetentionSweeper"]

log = durably_logger("durably.retention")

#: The name held (like an instance id) by the one engine sweeping a store.
RETENTION_HOLD = "durably:retention-sweeper"


class _SweepStore(RetentionStore, LeaseStore, Protocol):
    """What the sweep needs: the prune batches and the hold."""


class RetentionSweeper:
    def __init__(
        self,
        store: _SweepStore,
        policies: Sequence[RetentionPolicy],
        *,
        clock: Callable[[], int],
        interval_ms: int,
        batch_size: int,
        max_batches: int,
    ) -> None:
        self._store = store
        self.policies = list(policies)
        self._clock = clock
        self._interval_ms = interval_ms
        self._batch_size = batch_size
        self._max_batches = max_batches
        self._hold: InstanceHold | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        #: Sweeps done by this engine (each a list of one result per policy), newest last.
        self.sweeps = 0
        self.last: list[PruneResult] = []

    @property
    def holds(self) -> bool:
        """Whether this engine is the store's sweeper."""
        return self._hold is not None

    def start(self) -> None:
        if self._task is None and self.policies:
            self._task = asyncio.create_task(self._loop(), name="durably-retention")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        hold, self._hold = self._hold, None
        if hold is not None:
            await hold.release()

    async def sweep(self) -> list[PruneResult] | None:
        """One sweep now; None when another engine holds the sweep (or one is running)."""
        if self._lock.locked():
            return None
        async with self._lock:
            if self._hold is None:
                self._hold = await self._store.hold_instance(RETENTION_HOLD)
                if self._hold is None:
                    return None
            now = self._clock()
            results = [
                await prune(
                    self._store,
                    policy,
                    now,
                    batch_size=self._batch_size,
                    max_batches=self._max_batches,
                )
                for policy in self.policies
            ]
            self.sweeps += 1
            self.last = results
            return results

    async def _loop(self) -> None:
        while True:
            try:
                results = await self.sweep()
                if results:
                    deleted = sum(r.count for r in results)
                    if deleted:
                        log.info("retention: pruned %d finished run(s)", deleted)
            except Exception as exc:  # the store is down: try again at the next interval
                log.warning("retention sweep failed: %s", exc)
            if self._interval_ms <= 0:
                return
            await asyncio.sleep(self._interval_ms / 1000.0)
