"""Run facets of the in-memory reference store.

- `run_facets`: every run matching the `RunFacetQuery`, one `(status, origin, 1)` cell each,
  merged (`merge_run_facet_rows`);
- `run_value_facets`: every axis over the newest `scan` (5000) matching runs
  (`run_value_facets_from_runs`) — for the column axes that is exact whenever fewer than
  `scan` runs match (the SQL stores count column axes exactly over every run);
- `lease_owners`: unexpired leases grouped by `(namespace, owner)`.

The answers the SQL stores must reproduce.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from durably._core.models import RunQuery, WorkflowRun
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
from durably._store.query import newest_first


class MemoryRunFacets:
    """Mixed into `InMemoryStateStore` (which provides what is declared here)."""

    if TYPE_CHECKING:
        _runs: dict[str, WorkflowRun]

        def _tick(self) -> None: ...
        def _select(self, query: RunQuery) -> list[WorkflowRun]: ...

    async def run_facets(self, query: RunQuery) -> list[RunFacetRow]:
        """`(status, origin, count)` cells over every run matching `query` minus its
        status/origin predicates and page."""
        self._tick()
        return run_facets_from_runs(newest_first(self._select(facet_query(query))))

    async def run_value_facets(
        self,
        axis: RunValueAxis | Mapping[str, Any] | str,
        query: RunQuery,
        opts: RunValueFacetOptions | Mapping[str, Any] | None = None,
    ) -> list[RunValueFacetRow]:
        """Values of `axis` over the newest `scan` runs matching `query`."""
        self._tick()
        options = RunValueFacetOptions.of(opts)
        window = newest_first(self._select(unpaged(query)))[: options.effective_scan]
        return run_value_facets_from_runs(window, axis, options)

    async def lease_owners(self, now_ms: int, namespace: str | None = None) -> list[LeaseOwnerRow]:
        """Unexpired leases grouped by `(namespace, owner)`."""
        self._tick()
        return lease_owners_from_runs(self._runs.values(), now_ms, namespace)


__all__ = ["MemoryRunFacets"]
