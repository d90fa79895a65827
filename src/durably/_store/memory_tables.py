"""The rows of one in-memory reference store, shared by the store and its part objects.

`InMemoryStateStore` is assembled from part objects (aggregates, facets, start admission,
the signal buffer), each a class of its own module. They all work on the same rows and bump
the same test counters, so those live here, on one object the store makes and hands to each
part, rather than on the store where a part would have to reach into its host. The methods
are the few every part needs over those rows: count a call, count checkpoint rows read, read
the clock, select runs through the attribute index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

from durably._core.models import (
    AttributeFilter,
    AttributeValue,
    BufferedEvent,
    RunQuery,
    SignalWaiter,
    StepCheckpoint,
    WorkflowRun,
    ms_from_utc,
)
from durably._store.protocol import BULK_CHUNK
from durably._store.query import attribute_value_matches, matches_query


class MemoryTables:
    """The dicts of one in-memory store, its attribute index, its clock and its counters."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.clock = clock
        self.runs: dict[str, WorkflowRun] = {}
        # run_id -> seq -> row (keyed by (run_id, seq), grouped by run for cheap scans)
        self.checkpoints: dict[str, dict[int, StepCheckpoint]] = {}
        self.waiters: dict[str, SignalWaiter] = {}
        self.events: dict[str, BufferedEvent] = {}
        # attribute index: key -> run_id -> typed value (narrows attribute filters)
        self.attr_index: dict[str, dict[str, AttributeValue]] = {}

        #: store calls served ("statements"): one per call, one per chunk for the bulk calls.
        self.statement_count = 0
        #: runs the attribute index let through on the last filtered selection.
        self.last_attribute_candidates = 0
        #: checkpoint rows returned by the last counted read, and by all of them.
        self.last_checkpoint_rows_read = 0
        self.checkpoint_rows_read = 0
        #: buckets returned by `checkpoint_stats` (the rows a SQL `GROUP BY` sends back).
        self.checkpoint_stats_rows_read = 0

    # ------------------------------------------------------------------ counters

    def tick(self) -> None:
        self.statement_count += 1

    def tick_chunks(self, n: int) -> None:
        """A bulk call: one "statement" per chunk of BULK_CHUNK entries, as the SQL store
        counts them."""
        self.statement_count += max(1, -(-n // BULK_CHUNK))

    def rows_read(self, n: int, *, last: bool = True) -> None:
        self.checkpoint_rows_read += n
        if last:
            self.last_checkpoint_rows_read = n

    def now_ms(self) -> int:
        return ms_from_utc(self.clock())

    # ------------------------------------------------------------------ reads

    def run_checkpoints(self, run_id: str) -> list[StepCheckpoint]:
        rows = self.checkpoints.get(run_id)
        if not rows:
            return []
        return [rows[seq] for seq in sorted(rows)]

    def select(self, query: RunQuery) -> list[WorkflowRun]:
        """Filtered (unpaged, unordered) stored rows matching `query`."""
        pool: Iterable[WorkflowRun]
        if query.attributes:
            pool = [self.runs[rid] for rid in self._attribute_candidates(query.attributes)]
        else:
            pool = self.runs.values()
        return [run for run in pool if matches_query(run, query)]

    def _attribute_candidates(self, filters: Sequence[AttributeFilter]) -> set[str]:
        """Index pass: intersect the per-filter candidate sets."""
        candidates: set[str] | None = None
        for flt in filters:
            bucket = self.attr_index.get(flt.key, {})
            ids = {rid for rid, value in bucket.items() if attribute_value_matches(value, flt)}
            candidates = ids if candidates is None else candidates & ids
            if not candidates:
                break
        result = candidates or set()
        self.last_attribute_candidates = len(result)
        return result

    # ------------------------------------------------------------------ attribute index

    def index_attributes(self, run_id: str, attrs: Mapping[str, AttributeValue] | None) -> None:
        for key, value in (attrs or {}).items():
            self.attr_index.setdefault(key, {})[run_id] = value

    def unindex_attributes(self, run: WorkflowRun) -> None:
        for key in run.search_attributes or {}:
            bucket = self.attr_index.get(key)
            if bucket is not None:
                bucket.pop(run.id, None)
                if not bucket:
                    del self.attr_index[key]


__all__ = ["MemoryTables"]
