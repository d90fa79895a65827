"""Run facets of the in-memory reference store.

- `run_facets`: every run matching the `RunFacetQuery`, one `(status, origin, 1)` cell each,
  merged (`merge_run_facet_rows`);
- `run_value_facets`: every axis over the newest `scan` (5000) matching runs
  (`run_value_facets_from_runs`) — for the column axes that is exact whenever fewer than
  `scan` runs match (the SQL stores count column axes exactly over every run);
- `run_activity`: runs started / completed / failed per time bucket
  (`run_activity_from_runs`) over every matching run;
- `lease_owners`: unexpired leases grouped by `(namespace, owner)`.

The answers the SQL stores must reproduce. A part object of `InMemoryStateStore` (which
forwards the three contract methods to it): it is given the store's `MemoryTables`, whose
`select` is the same attribute-indexed selection `list_runs` uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durably._core.models import RunQuery
from durably._core.run_activity import ActivityBucket, ActivityWindow, run_activity_from_runs
from durably._core.run_facets import (
    LeaseOwnerRow,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    facet_query,
    lease_owners_from_runs,
    run_facets_from_runs,
    run_value_facets_from_runs,
    unpaged,
)
from durably._store.memory_tables import MemoryTables
from durably._store.query import newest_first


class MemoryRunFacets:
    """Run facets and lease owners over the runs of `tables`."""

    def __init__(self, tables: MemoryTables) -> None:
        self._tables = tables

    async def run_facets(self, query: RunQuery) -> list[RunFacetRow]:
        self._tables.tick()
        return run_facets_from_runs(newest_first(self._tables.select(facet_query(query))))

    async def run_value_facets(
        self,
        axis: RunValueAxis | Mapping[str, Any] | str,
        query: RunQuery,
        opts: RunValueFacetOptions | Mapping[str, Any] | None = None,
    ) -> list[RunValueFacetRow]:
        self._tables.tick()
        options = RunValueFacetOptions.of(opts)
        window = newest_first(self._tables.select(unpaged(query)))[: options.effective_scan]
        return run_value_facets_from_runs(window, axis, options)

    async def run_activity(self, query: RunQuery, window: ActivityWindow) -> list[ActivityBucket]:
        self._tables.tick()
        return run_activity_from_runs(self._tables.select(unpaged(query)), window)

    async def lease_owners(self, now_ms: int, namespace: str | None = None) -> list[LeaseOwnerRow]:
        self._tables.tick()
        return lease_owners_from_runs(self._tables.runs.values(), now_ms, namespace)


__all__ = ["MemoryRunFacets"]
