"""Pure run-query and search-attribute helpers shared by every store.

These functions are the in-process reference semantics: the in-memory store filters with them
directly, and a SQL store pushes the same predicates down (`attribute_predicate_operands`,
`normalize_attribute_rows`) so both agree row for row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from durably._core.models import (
    UNSET,
    AttributeFilter,
    AttributeOp,
    AttributeValue,
    RunQuery,
    WorkflowRun,
)

_T = TypeVar("_T")

DEFAULT_NAMESPACE = "default"

AttributeColumn = str  # "str_value" | "num_value"


class AttributeRow(NamedTuple):
    """One row of `durable_run_attributes` (one search attribute of one run)."""

    run_id: str
    key: str
    str_value: str | None
    num_value: float | None


# ------------------------------------------------------------------ namespaces


def namespace_matches(run_namespace: str | None, namespace: str | None) -> bool:
    """`None` = no restriction; `'default'` also matches a NULL column; else plain equality."""
    if namespace is None:
        return True
    if namespace == DEFAULT_NAMESPACE:
        return run_namespace is None or run_namespace == DEFAULT_NAMESPACE
    return run_namespace == namespace


# ------------------------------------------------------------------ search attributes


def _kind(value: object) -> str | None:
    # bool is checked before int (True == 1 in Python); ints and floats are the
    # same JSON "number" kind and share the `num_value` column.
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "num"
    if isinstance(value, str):
        return "str"
    return None


def _scalar_matches(actual: object, op: AttributeOp, operand: object) -> bool:
    kind = _kind(actual)
    if kind is None or kind != _kind(operand):
        # A string operand never matches a numeric attribute and vice versa.
        return False
    a: Any = actual
    b: Any = operand
    if op == "eq":
        return bool(a == b)
    if op == "ne":
        return bool(a != b)
    # Same kind on both sides, so the comparison is numeric or code-point lexicographic;
    # bools order false < true exactly like their 'false'/'true' str_value rendering.
    if op == "gt":
        return bool(a > b)
    if op == "gte":
        return bool(a >= b)
    if op == "lt":
        return bool(a < b)
    if op == "lte":
        return bool(a <= b)
    raise ValueError(f"unknown attribute operator {op!r}")


def attribute_value_matches(value: object, flt: AttributeFilter) -> bool:
    """Does a present attribute `value` satisfy `flt`? (The key is assumed to match.)"""
    if flt.op == "in":
        # OR of equalities; mixed operand types allowed; `[]` matches nothing.
        return any(_scalar_matches(value, "eq", v) for v in flt.values or ())
    return _scalar_matches(value, flt.op, flt.value)


def matches_attribute_filter(
    attrs: Mapping[str, AttributeValue] | None, flt: AttributeFilter
) -> bool:
    # A run lacking the key NEVER matches, for every op including `ne` and `in`.
    if not attrs or flt.key not in attrs:
        return False
    return attribute_value_matches(attrs[flt.key], flt)


def matches_attributes(run: WorkflowRun, filters: Sequence[AttributeFilter] | None) -> bool:
    """The reference attribute match: every filter ANDed; empty/absent filters match everything."""
    if not filters:
        return True
    attrs = run.search_attributes
    return all(matches_attribute_filter(attrs, f) for f in filters)


def normalize_attribute_rows(
    run_id: str, attrs: Mapping[str, AttributeValue] | None
) -> list[AttributeRow]:
    """A run's attribute rows: number → num_value; bool → str_value 'true'/'false';
    str → str_value."""
    rows: list[AttributeRow] = []
    if not attrs:
        return rows
    for key, value in attrs.items():
        kind = _kind(value)
        if kind == "bool":
            rows.append(AttributeRow(run_id, key, "true" if value else "false", None))
        elif kind == "num":
            rows.append(AttributeRow(run_id, key, None, float(value)))
        elif kind == "str":
            rows.append(AttributeRow(run_id, key, str(value), None))
        else:
            raise ValueError(
                f"search attribute {key!r} of run {run_id} must be str, int, float or bool, "
                f"got {type(value).__name__}"
            )
    return rows


_SQL_COMPARATORS: dict[str, str] = {
    "eq": "=",
    "ne": "<>",
    "gt": ">",
    "gte": ">=",
    "lt": "<",
    "lte": "<=",
}


def sql_comparator(op: AttributeOp) -> str:
    try:
        return _SQL_COMPARATORS[op]
    except KeyError:
        raise ValueError(f"attribute operator {op!r} has no scalar SQL comparator") from None


def _operand(value: object) -> tuple[AttributeColumn, str | float]:
    kind = _kind(value)
    if kind == "bool":
        return "str_value", "true" if value else "false"
    if kind == "num":
        return "num_value", float(value)  # type: ignore[arg-type]
    if kind == "str":
        return "str_value", str(value)
    raise ValueError(f"attribute operand must be str, int, float or bool, got {value!r}")


def attribute_predicate_operands(
    flt: AttributeFilter,
) -> list[tuple[AttributeColumn, str, str | float]]:
    """`(column, comparator, operand)` triples ORed inside one EXISTS (SQL push-down).

    A scalar op yields exactly one triple; `in` one `=` triple per member (possibly mixed
    columns); an empty `in` yields `[]`, which the caller must render as a false predicate.
    """
    if flt.op == "in":
        out: list[tuple[AttributeColumn, str, str | float]] = []
        for member in flt.values or ():
            column, operand = _operand(member)
            out.append((column, "=", operand))
        return out
    column, operand = _operand(flt.value)
    return [(column, sql_comparator(flt.op), operand)]


# ------------------------------------------------------------------ RunQuery


def _in(value: object, members: Iterable[object] | None) -> bool:
    return members is None or value in members


def matches_query(run: WorkflowRun, query: RunQuery) -> bool:
    """Every non-paging predicate of `query`, ANDed."""
    if query.workflow is not None and run.workflow != query.workflow:
        return False
    if not _in(run.workflow, query.workflows):
        return False
    if query.status is not None and run.status != query.status:
        return False
    if not _in(run.status, query.statuses):
        return False
    if query.tag is not None and (not run.tags or query.tag not in run.tags):
        return False
    if query.tags is not None and (not run.tags or not any(t in run.tags for t in query.tags)):
        return False
    if not namespace_matches(run.namespace, query.namespace):
        return False
    if query.namespaces is not None and (
        (run.namespace or DEFAULT_NAMESPACE) not in query.namespaces
    ):
        return False
    # origin: UNSET = no restriction; None = IS NULL; a string = equality (never matches NULL).
    if query.origin is not UNSET and run.origin != query.origin:
        return False
    if not _in(run.origin, query.origins):
        return False
    return matches_attributes(run, query.attributes)


def newest_first(runs: Iterable[WorkflowRun]) -> list[WorkflowRun]:
    """List order of runs: `created_at DESC`, ties by `id DESC` (so pages are stable)."""
    return sorted(runs, key=lambda r: (r.created_at, r.id), reverse=True)


def pickup_order(run: WorkflowRun) -> tuple[int, datetime, str]:
    """Sort key of the order pending runs are picked up in: higher `priority` first, then
    oldest (`created_at`, `id`). A run without a priority counts as 0, so a negative priority
    yields to runs that never set one."""
    return (-(run.priority or 0), run.created_at, run.id)


def page(rows: Sequence[_T], offset: int | None, limit: int | None) -> list[_T]:
    start = max(offset or 0, 0)
    if limit is None:
        return list(rows[start:])
    return list(rows[start : start + max(limit, 0)])


def apply_run_query(runs: Iterable[WorkflowRun], query: RunQuery) -> list[WorkflowRun]:
    """Filter, order newest first, then page: the full in-process `list_runs`."""
    return page(newest_first(r for r in runs if matches_query(r, query)), query.offset, query.limit)


def apply_attribute_query(rows: Iterable[WorkflowRun], query: RunQuery) -> list[WorkflowRun]:
    """For a store that cannot push attribute filters down: filter, then slice."""
    kept = [r for r in rows if matches_attributes(r, query.attributes)]
    return page(kept, query.offset, query.limit)


__all__ = [
    "DEFAULT_NAMESPACE",
    "AttributeRow",
    "apply_attribute_query",
    "apply_run_query",
    "attribute_predicate_operands",
    "attribute_value_matches",
    "matches_attribute_filter",
    "matches_attributes",
    "matches_query",
    "namespace_matches",
    "newest_first",
    "normalize_attribute_rows",
    "page",
    "pickup_order",
    "sql_comparator",
]
