"""Checkpoint aggregates of the in-memory reference store.

`checkpoint_stats` is `checkpoint_stats_of` over the run's rows and `query_checkpoints` is
`query_checkpoints_of`: the reference answers the SQL stores must reproduce.

Test hooks: `query_checkpoints` adds the rows it returns to
`checkpoint_rows_read` and sets `last_checkpoint_rows_read`; `checkpoint_stats` returns no
rows and adds nothing there. `checkpoint_stats_rows_read` counts the buckets every
`checkpoint_stats` call returned — the rows a SQL store's `GROUP BY` sends back — so one test
can compare the two store families.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from durably._core.aggregates import (
    CheckpointQuery,
    CheckpointStat,
    as_checkpoint_query,
    checkpoint_stats_of,
    query_checkpoints_of,
)
from durably._core.models import StepCheckpoint
from durably._store.memory_rows import read_checkpoint


class MemoryCheckpointAggregates:
    """Mixed into `InMemoryStateStore` (which provides what is declared here)."""

    #: buckets returned by `checkpoint_stats` since construction.
    checkpoint_stats_rows_read: int = 0

    if TYPE_CHECKING:
        _checkpoints: dict[str, dict[int, StepCheckpoint]]

        def _tick(self) -> None: ...
        def _rows_read(self, n: int, *, last: bool = True) -> None: ...
        def _run_checkpoints(self, run_id: str) -> list[StepCheckpoint]: ...

    async def checkpoint_stats(self, run_id: str, group: str | None = None) -> list[CheckpointStat]:
        """One bucket per `(parallelGroup, status, nameKind)` , ordered by
        `min_seq`; only `group`'s checkpoints when given."""
        self._tick()
        stats = checkpoint_stats_of(self._checkpoints.get(run_id, {}).values(), group)
        self.checkpoint_stats_rows_read += len(stats)
        return stats

    async def query_checkpoints(
        self, run_id: str, query: CheckpointQuery | Mapping[str, Any] | None = None
    ) -> list[StepCheckpoint]:
        """The run's checkpoints matching `query`, by seq, then `offset`/`limit` (a
        `CheckpointQuery`, or its camelCase JSON mapping)."""
        self._tick()
        rows = query_checkpoints_of(self._run_checkpoints(run_id), as_checkpoint_query(query))
        self._rows_read(len(rows))
        return [read_checkpoint(cp) for cp in rows]


__all__ = ["MemoryCheckpointAggregates"]
