"""`RunQuery` → SQL predicates.

Every present filter becomes one predicate, ANDed; a plural given as `[]` becomes a false
predicate (never dropped). Tags and search attributes are correlated `EXISTS` subqueries over
the side tables, so filtering and paging both happen in SQL.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

import sqlalchemy as sa

from durably._core.models import UNSET, AttributeFilter, RunQuery
from durably._store.query import DEFAULT_NAMESPACE, attribute_predicate_operands
from durably._store.sql.schema import attributes, runs, tags

_COMPARATORS: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "<>": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}

Predicate = sa.ColumnElement[bool]


def namespace_predicate(namespace: str | None) -> Predicate | None:
    """`None` = no restriction; `'default'` also matches NULL (legacy rows); else equality."""
    if namespace is None:
        return None
    if namespace == DEFAULT_NAMESPACE:
        return sa.or_(runs.c.namespace == DEFAULT_NAMESPACE, runs.c.namespace.is_(None))
    return runs.c.namespace == namespace


def _in(column: sa.ColumnElement[Any], values: Sequence[Any]) -> Predicate:
    if not values:
        return sa.false()
    unique = list(dict.fromkeys(values))
    if len(unique) == 1:
        return cast(Predicate, column == unique[0])
    return column.in_(unique)


def _namespaces_predicate(namespaces: Sequence[str]) -> Predicate:
    if not namespaces:
        return sa.false()
    pred = _in(runs.c.namespace, namespaces)
    if DEFAULT_NAMESPACE in namespaces:
        return sa.or_(pred, runs.c.namespace.is_(None))
    return pred


def _origins_predicate(origins: Sequence[str | None]) -> Predicate:
    if not origins:
        return sa.false()
    named = [o for o in origins if o is not None]
    parts: list[Predicate] = []
    if named:
        parts.append(_in(runs.c.origin, named))
    if len(named) != len(origins):
        parts.append(runs.c.origin.is_(None))
    return parts[0] if len(parts) == 1 else sa.or_(*parts)


def _tags_exists(wanted: Sequence[str]) -> Predicate:
    if not wanted:
        return sa.false()
    return sa.exists().where(tags.c.run_id == runs.c.id, _in(tags.c.tag, wanted))


def attribute_predicate(flt: AttributeFilter) -> Predicate:
    """One correlated EXISTS per filter; an empty `in` is false."""
    operands = attribute_predicate_operands(flt)
    if not operands:
        return sa.false()
    clauses: list[Predicate] = []
    for column_name, comparator, operand in operands:
        column = attributes.c[column_name]
        clauses.append(_COMPARATORS[comparator](column, operand))
    match = clauses[0] if len(clauses) == 1 else sa.or_(*clauses)
    return sa.exists().where(
        attributes.c.run_id == runs.c.id,
        attributes.c.key == flt.key,
        match,
    )


def run_query_predicates(query: RunQuery) -> list[Predicate]:
    preds: list[Predicate] = []
    if query.workflow is not None:
        preds.append(runs.c.workflow == query.workflow)
    if query.workflows is not None:
        preds.append(_in(runs.c.workflow, query.workflows))
    if query.status is not None:
        preds.append(runs.c.status == query.status)
    if query.statuses is not None:
        preds.append(_in(runs.c.status, query.statuses))
    ns = namespace_predicate(query.namespace)
    if ns is not None:
        preds.append(ns)
    if query.namespaces is not None:
        preds.append(_namespaces_predicate(query.namespaces))
    if query.origin is not UNSET:
        if query.origin is None:
            preds.append(runs.c.origin.is_(None))
        else:
            preds.append(runs.c.origin == query.origin)
    if query.origins is not None:
        preds.append(_origins_predicate(query.origins))
    if query.tag is not None:
        preds.append(_tags_exists([query.tag]))
    if query.tags is not None:
        preds.append(_tags_exists(query.tags))
    for flt in query.attributes or ():
        preds.append(attribute_predicate(flt))
    return preds


__all__ = ["attribute_predicate", "namespace_predicate", "run_query_predicates"]
