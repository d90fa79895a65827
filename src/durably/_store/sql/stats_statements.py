"""The `GROUP BY` of `checkpoint_stats`, built once per store (`Statements.cp_stats*`).

A leaf of the SQL store's statements: `statements.py` builds it, `aggregates.py` runs it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import bindparam

from durably._core.aggregates import NameKind
from durably._store.sql.dialect import SqlDialect
from durably._store.sql.schema import checkpoints

# The name prefixes of each kind, in the order the CASE tests them (first match wins).
_NAME_KIND_PREFIXES: tuple[tuple[str, NameKind], ...] = (
    ("signal:child:", "child"),
    ("fan:", "folded"),
    ("spawn:", "spawn"),
)


def _sql_literal(value: str | int) -> sa.ColumnElement[Any]:
    """A constant rendered into the SQL text (only ever our own constants): the same
    expression then reads the same in the select list on every backend."""
    text = str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"
    return sa.literal_column(text)


def name_kind_case(name: sa.ColumnElement[str]) -> sa.ColumnElement[str]:
    """`CASE WHEN substr(name,1,13) = 'signal:child:' THEN 'child' … END`."""
    whens = [
        (
            sa.func.substr(name, _sql_literal(1), _sql_literal(len(prefix)))
            == _sql_literal(prefix),
            _sql_literal(kind),
        )
        for prefix, kind in _NAME_KIND_PREFIXES
    ]
    return sa.case(*whens, else_=_sql_literal("step"))


def checkpoint_stats_statements(dialect: SqlDialect) -> tuple[sa.Select[Any], sa.Select[Any]]:
    """(every group, one group) variants of the aggregate `GROUP BY`; binds
    `run_id` (and `group`). Buckets ordered by their first seq (one total order: a seq lives
    in one bucket)."""
    c = checkpoints.c
    name: sa.ColumnElement[str] = c.name if dialect.is_sqlite else c.name.collate("C")
    kind: sa.ColumnElement[str] = sa.literal_column("name_kind")
    columns = (
        c.parallel_group,
        c.status,
        name_kind_case(c.name).label("name_kind"),
        sa.func.count().label("n"),
        sa.func.min(c.seq).label("min_seq"),
        sa.func.max(c.seq),
        sa.func.min(name),
        sa.func.max(name),
        sa.func.min(sa.func.coalesce(c.enqueued_at, c.started_at)),
        sa.func.min(c.started_at),
        sa.func.max(c.started_at),
        sa.func.max(c.finished_at),
        sa.func.sum(c.attempts),
    )

    def shape(*where: sa.ColumnElement[bool]) -> sa.Select[Any]:
        return (
            sa.select(*columns)
            .where(c.run_id == bindparam("run_id"), *where)
            .group_by(c.parallel_group, c.status, kind)
            .order_by(sa.literal_column("min_seq"))
        )

    return shape(), shape(c.parallel_group == bindparam("group"))


__all__ = ["checkpoint_stats_statements", "name_kind_case"]
