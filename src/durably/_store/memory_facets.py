"""Run facets of the in-memory reference store (run-detail.md §4–§6, store.md §3.10).

- `run_facets`: every run matching the `RunFacetQuery`, one `(status, origin, 1)` cell each,
  merged (`merge_run_facet_rows`);
- `run_value_facets`: every axis over the newest `scan` (5000) matching runs
  (`run_value_facets_from_runs`), as run-detail.md §5 says of the in-memory store — for the
  column axes that is exact whenever fewer than `scan` runs match;
- `lease_owners` (durably): unexpired leases grouped by `(namespace, owner)`.

The answers the SQL stores must reproduce.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from durably._core.models import RunQuery, WorkflowRun
from durably._read.list_models import (
    LeaseOwnerRow,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
)
from durably._read.lists import (
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
        status/origin predicates and page (run-detail.md §4)."""
        self._tick()
        return run_facets_from_runs(newest_first(self._select(facet_query(query))))

    async def run_value_facets(
        self,
        axis: RunValueAxis | Mapping[str, Any] | str,
        query: RunQuery,
        opts: RunValueFacetOptions | Mapping[str, Any] | None = None,
    ) -> list[RunValueFacetRow]:
        """Values of `axis` over the newest `scan` runs matching `query` (run-detail.md §5)."""
        self._tick()
        options = RunValueFacetOptions.of(opts)
        window = newest_first(self._select(unpaged(query)))[: options.effective_scan]
        return run_value_facets_from_runs(window, axis, options)

    async def lease_owners(self, now_ms: int, namespace: str | None = None) -> list[LeaseOwnerRow]:
        """(durably) Unexpired leases grouped by `(namespace, owner)`."""
        self._tick()
        return lease_owners_from_runs(self._runs.values(), now_ms, namespace)


__all__ = ["MemoryRunFacets"]
