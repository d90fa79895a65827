"""Checkpoint aggregates of the in-memory reference store.

`checkpoint_stats` is `checkpoint_stats_of` over the run's rows and `query_checkpoints` is
`query_checkpoints_of`: the reference answers the SQL stores must reproduce.

A part object of `InMemoryStateStore` (which forwards the two contract methods to it): it
is given the store's `MemoryTables` and reads and counts nothing else, so it needs no view
of the store itself.

Test hooks (on `MemoryTables`, read through the store): `query_checkpoints` adds the rows it
returns to `checkpoint_rows_read` and sets `last_checkpoint_rows_read`; `checkpoint_stats`
returns no rows and adds nothing there. `checkpoint_stats_rows_read` counts the buckets every
`checkpoint_stats` call returned — the rows a SQL store's `GROUP BY` sends back — so one test
can compare the two store families.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durably._core.aggregates import (
    CheckpointQuery,
    CheckpointStat,
    as_checkpoint_query,
    checkpoint_stats_of,
    query_checkpoints_of,
)
from durably._core.models import StepCheckpoint
from durably._store.memory_rows import read_checkpoint
from durably._store.memory_tables import MemoryTables


class MemoryCheckpointAggregates:
    """`checkpoint_stats` and `query_checkpoints` over the rows of `tables`."""

    def __init__(self, tables: MemoryTables) -> None:
        self._tables = tables

    async def checkpoint_stats(self, run_id: str, group: str | None = None) -> list[CheckpointStat]:
        t = self._tables
        t.tick()
        stats = checkpoint_stats_of(t.checkpoints.get(run_id, {}).values(), group)
        t.checkpoint_stats_rows_read += len(stats)
        return stats

    async def query_checkpoints(
        self, run_id: str, query: CheckpointQuery | Mapping[str, Any] | None = None
    ) -> list[StepCheckpoint]:
        t = self._tables
        t.tick()
        rows = query_checkpoints_of(t.run_checkpoints(run_id), as_checkpoint_query(query))
        t.rows_read(len(rows))
        return [read_checkpoint(cp) for cp in rows]


__all__ = ["MemoryCheckpointAggregates"]
