"""Run facet rows and the pure arithmetic every store uses to build them.

The console counts runs in three ways, each over the WHOLE filtered set (never one page):

- run facets: one `RunFacetRow` per `(status, origin)`, so the status and origin chips keep
  their counts while the list is paged; a blank origin counts as "unattributed" (None);
- value facets: one `RunValueFacetRow` per value of an axis (a run column, a tag, a search
  attribute key or one attribute's values), for the filter pickers; tag and attribute axes
  look only at the newest `scan` matching runs, so a huge history stays cheap;
- lease owners: one `LeaseOwnerRow` per `(namespace, engine)` holding live run leases, which
  is how worker health sees the engines of other processes without a heartbeat table.

Stores return these rows (the types live here, below the store layer, so a store never
imports the read side); every store pipes its raw cells through the same merges
(`merge_run_facet_rows`, `merge_run_value_facet_rows`), so the in-memory reference, SQLite
and PostgreSQL return identical lists. The `*_from_runs` functions are the in-memory
reference answers, computed over run rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, cast

from durably._core.jsonshape import JsonObject, json_field
from durably._core.models import UNSET, RunQuery, RunStatus, WorkflowRun

__all__ = [
    "COLUMN_AXES",
    "RUN_VALUE_FACET_LIMIT",
    "RUN_VALUE_FACET_SCAN",
    "LeaseOwnerRow",
    "RunFacetRow",
    "RunValueAxis",
    "RunValueFacetOptions",
    "RunValueFacetRow",
    "RunValueField",
    "axis_is_run_column",
    "facet_origin",
    "facet_query",
    "js_string",
    "lease_owners_from_runs",
    "merge_run_facet_rows",
    "merge_run_value_facet_rows",
    "run_facets_from_runs",
    "run_value_facets_from_runs",
    "unpaged",
    "values_of",
]

#: Value facets answer at most this many rows unless asked for another limit.
RUN_VALUE_FACET_LIMIT = 100
#: Tag and attribute axes count over at most this many of the newest matching runs.
RUN_VALUE_FACET_SCAN = 5000

RunValueField = Literal[
    "workflow", "status", "origin", "namespace", "tag", "attributeKey", "attributeValue"
]
#: The axes that are columns of `durable_workflow_runs` (`axis_is_run_column`).
COLUMN_AXES: frozenset[str] = frozenset({"workflow", "status", "origin", "namespace"})
_FIELDS: frozenset[str] = COLUMN_AXES | {"tag", "attributeKey", "attributeValue"}


# ---------------------------------------------------------------- queries


def unpaged(query: RunQuery) -> RunQuery:
    """`query` without `limit`/`offset` (counts and facets are whole-set)."""
    if query.limit is None and query.offset is None:
        return query
    return dataclasses.replace(query, limit=None, offset=None)


def facet_query(query: RunQuery) -> RunQuery:
    """The query a run-facet count runs: `query` without `status`, `statuses`, `origin`,
    `origins` (the two axes being counted) and the page window."""
    return dataclasses.replace(
        query, status=None, statuses=None, origin=UNSET, origins=None, limit=None, offset=None
    )


# ---------------------------------------------------------------- run facets


@dataclass(frozen=True, slots=True)
class RunFacetRow(JsonObject):
    """One `GROUP BY status, origin` cell; `origin` None = unattributed
    (always present in JSON, as `null`)."""

    status: RunStatus
    origin: str | None = field(metadata=json_field(write="always"))
    count: int


def facet_origin(origin: object) -> str | None:
    """`origin` unchanged when a string with non-blank content, else None."""
    if isinstance(origin, str) and origin.strip():
        return origin
    return None


def merge_run_facet_rows(
    rows: Iterable[RunFacetRow | tuple[str, str | None, int]],
) -> list[RunFacetRow]:
    """One cell per `(status, facet_origin(origin))`, counts summed, first-seen order;
    non-positive cells dropped."""
    cells: dict[tuple[str, str | None], int] = {}
    for row in rows:
        if isinstance(row, RunFacetRow):
            row = (row.status, row.origin, row.count)
        status, origin, count = row
        key = (str(status), facet_origin(origin))
        cells[key] = cells.get(key, 0) + int(count)
    return [
        RunFacetRow(status=cast(RunStatus, status), origin=origin, count=count)
        for (status, origin), count in cells.items()
        if count > 0
    ]


def run_facets_from_runs(runs: Iterable[WorkflowRun]) -> list[RunFacetRow]:
    """The in-memory reference: one `(status, origin, 1)` cell per run, merged."""
    return merge_run_facet_rows((r.status, r.origin, 1) for r in runs)


# ---------------------------------------------------------------- value facets


@dataclass(frozen=True, slots=True)
class RunValueAxis:
    """What a value facet counts: a run column, `tag`, `attributeKey`, or
    `attributeValue` of one search attribute `key`."""

    field: RunValueField
    key: str | None = None

    def __post_init__(self) -> None:
        if self.field not in _FIELDS:
            raise ValueError(f"unknown run value facet field {self.field!r}")
        if self.field == "attributeValue" and not isinstance(self.key, str):
            raise ValueError("the attributeValue axis needs a `key`")

    def to_json(self) -> dict[str, Any]:
        if self.field == "attributeValue":
            return {"field": self.field, "key": self.key}
        return {"field": self.field}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunValueAxis:
        key = data.get("key")
        return cls(
            field=cast(RunValueField, str(data["field"])),
            key=key if isinstance(key, str) else None,
        )

    @classmethod
    def of(cls, axis: RunValueAxis | Mapping[str, Any] | str) -> RunValueAxis:
        """Accept an axis, its JSON mapping, or a bare field name (`'tag'`)."""
        if isinstance(axis, RunValueAxis):
            return axis
        if isinstance(axis, str):
            return cls(field=cast(RunValueField, axis))
        return cls.from_json(axis)


@dataclass(frozen=True, slots=True)
class RunValueFacetOptions(JsonObject):
    """How many value rows to answer (`limit`, default 100) and how many of the newest
    matching runs the tag and attribute axes look at (`scan`, default 5000)."""

    limit: int | None = None
    scan: int | None = None

    @classmethod
    def of(cls, opts: RunValueFacetOptions | Mapping[str, Any] | None) -> RunValueFacetOptions:
        if opts is None:
            return cls()
        if isinstance(opts, RunValueFacetOptions):
            return opts
        return cls.from_json(opts)

    @property
    def effective_limit(self) -> int:
        return self.limit if self.limit else RUN_VALUE_FACET_LIMIT

    @property
    def effective_scan(self) -> int:
        return self.scan if self.scan else RUN_VALUE_FACET_SCAN


@dataclass(frozen=True, slots=True)
class RunValueFacetRow(JsonObject):
    """One value and how many runs carry it; `value` None only for the origin axis's
    unattributed bucket (always present in JSON)."""

    value: str | None = field(metadata=json_field(write="always"))
    count: int


def js_string(value: object) -> str:
    """JS `String(v)` for a search-attribute value: `True` → 'true', `200.0` → '200',
    `1e21` → '1e+21', `1e-7` → '1e-7', strings unchanged."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        if value == 0:
            return "0"
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        text = repr(value)
        if "e" not in text:
            return text
        if 1e-6 <= abs(value) < 1e21:  # JS writes these positionally
            return format(Decimal(text), "f")
        mantissa, exp = text.split("e")
        sign = "-" if exp.startswith("-") else "+"
        digits = exp.lstrip("+-").lstrip("0") or "0"
        return f"{mantissa.removesuffix('.0')}e{sign}{digits}"
        return text
    return str(value)


def axis_is_run_column(axis: RunValueAxis | Mapping[str, Any] | str) -> bool:
    """True for the `workflow`, `status`, `origin` and `namespace` axes."""
    return RunValueAxis.of(axis).field in COLUMN_AXES


def values_of(run: WorkflowRun, axis: RunValueAxis) -> list[str | None]:
    """The values one run contributes to `axis` ; tags count once per run."""
    f = axis.field
    if f == "workflow":
        return [run.workflow]
    if f == "status":
        return [run.status]
    if f == "origin":
        return [facet_origin(run.origin)]
    if f == "namespace":
        return [run.namespace or "default"]
    if f == "tag":
        return list(dict.fromkeys(run.tags or ()))
    attrs = run.search_attributes or {}
    if f == "attributeKey":
        return list(attrs)
    if axis.key is not None and axis.key in attrs:
        return [js_string(attrs[axis.key])]
    return []


def _value_sort_key(row: RunValueFacetRow) -> tuple[int, int, str]:
    return (-row.count, 1 if row.value is None else 0, row.value or "")


def merge_run_value_facet_rows(
    rows: Iterable[RunValueFacetRow | tuple[str | None, int]],
    opts: RunValueFacetOptions | Mapping[str, Any] | None = None,
) -> list[RunValueFacetRow]:
    """Sum per value (None/missing → None), drop non-positive counts, order by count DESC then
    value by code point with None last among equals, keep the first `limit` (100)."""
    sums: dict[str | None, int] = {}
    for row in rows:
        if isinstance(row, RunValueFacetRow):
            value, count = row.value, row.count
        else:
            value, count = row
        key = value if isinstance(value, str) else None
        sums[key] = sums.get(key, 0) + int(count)
    merged = [RunValueFacetRow(value=v, count=c) for v, c in sums.items() if c > 0]
    merged.sort(key=_value_sort_key)
    return merged[: RunValueFacetOptions.of(opts).effective_limit]


def run_value_facets_from_runs(
    runs: Iterable[WorkflowRun],
    axis: RunValueAxis | Mapping[str, Any] | str,
    opts: RunValueFacetOptions | Mapping[str, Any] | None = None,
) -> list[RunValueFacetRow]:
    """`runs` already filtered, newest first and cut to the scan window: one `(value, 1)` row
    per contributed value, merged."""
    ax = RunValueAxis.of(axis)
    return merge_run_value_facet_rows(
        ((v, 1) for run in runs for v in values_of(run, ax)), RunValueFacetOptions.of(opts)
    )


# ---------------------------------------------------------------- lease owners


@dataclass(frozen=True, slots=True)
class LeaseOwnerRow(JsonObject):
    """One `GROUP BY namespace, locked_by` cell over live leases: `owner` holds
    `runs` unexpired leases in `namespace`, the latest running until `lease_until` (ms).
    What `worker_health` reads instead of a heartbeat table."""

    namespace: str
    owner: str
    runs: int
    lease_until: int


def lease_owners_from_runs(
    runs: Iterable[WorkflowRun], now_ms: int, namespace: str | None = None
) -> list[LeaseOwnerRow]:
    """The in-process reference of `store.lease_owners`: unexpired leases grouped by
    `(namespace, owner)`, ordered by namespace then owner."""
    cells: dict[tuple[str, str], tuple[int, int]] = {}
    for run in runs:
        if run.locked_by is None or run.locked_until is None or run.locked_until <= now_ms:
            continue
        ns = run.namespace or "default"
        if namespace is not None and ns != namespace:
            continue
        n, until = cells.get((ns, run.locked_by), (0, 0))
        cells[(ns, run.locked_by)] = (n + 1, max(until, run.locked_until))
    return [
        LeaseOwnerRow(namespace=ns, owner=owner, runs=n, lease_until=until)
        for (ns, owner), (n, until) in sorted(cells.items())
    ]
