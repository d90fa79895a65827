"""The store-side helpers every store shares, without a store: the query helpers
(`durably._store.query`), the aggregate reference (`durably._core.aggregates`) and the
retention policy's validation."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from durably import AttributeFilter, RetentionPolicy, RunQuery
from durably._core.aggregates import CheckpointQuery, checkpoint_stats_of, query_checkpoints_of
from durably._store.query import (
    AttributeRow,
    attribute_predicate_operands,
    matches_attributes,
    matches_query,
    normalize_attribute_rows,
)
from durably.testing.conformance.state_store.aggregates import cp, timeline
from tests.store.support import at, make_run


def test_query_helpers_normalize_attribute_rows() -> None:
    rows = normalize_attribute_rows("r1", {"vip": True, "off": False, "n": 3, "s": "x"})
    assert rows == [
        AttributeRow("r1", "vip", "true", None),
        AttributeRow("r1", "off", "false", None),
        AttributeRow("r1", "n", None, 3.0),
        AttributeRow("r1", "s", "x", None),
    ]
    assert normalize_attribute_rows("r1", None) == []
    assert normalize_attribute_rows("r1", {}) == []


def test_query_helpers_attribute_predicate_operands() -> None:
    assert attribute_predicate_operands(AttributeFilter("a", "gt", 5)) == [("num_value", ">", 5.0)]
    assert attribute_predicate_operands(AttributeFilter("a", "ne", True)) == [
        ("str_value", "<>", "true")
    ]
    assert attribute_predicate_operands(AttributeFilter("a", "lte", "m")) == [
        ("str_value", "<=", "m")
    ]
    assert attribute_predicate_operands(AttributeFilter("a", "in", values=(200, "none"))) == [
        ("num_value", "=", 200.0),
        ("str_value", "=", "none"),
    ]
    assert attribute_predicate_operands(AttributeFilter("a", "in", values=())) == []


def test_query_helpers_matches_query_and_attributes() -> None:
    run = make_run(namespace="default", origin=None, tags=("etl",), search_attributes={"n": 1})
    assert matches_query(run, RunQuery())
    assert matches_query(run, RunQuery(namespace="default", origin=None, tag="etl"))
    assert not matches_query(run, RunQuery(origin="pkg"))
    assert not matches_query(run, RunQuery(tags=[]))
    assert matches_attributes(run, [AttributeFilter("n", "eq", 1)])
    assert not matches_attributes(run, [AttributeFilter("n", "eq", True)])
    assert not matches_attributes(run, [AttributeFilter("m", "ne", 1)])
    assert matches_attributes(run, None)
    legacy = make_run(namespace=None)
    assert matches_query(legacy, RunQuery(namespace="default"))
    assert not matches_query(legacy, RunQuery(namespace="acme"))


def test_reference_helpers_on_edge_cases() -> None:
    rows = timeline()
    assert checkpoint_stats_of([]) == []
    assert query_checkpoints_of([], CheckpointQuery(limit=3)) == []
    shuffled = list(reversed(rows))
    assert query_checkpoints_of(shuffled, None) == sorted(rows, key=lambda r: r.seq)
    kinds = {s.key[2] for s in checkpoint_stats_of([r for r in rows if r.name == "Fan:x"])}
    assert kinds == {"step"}
    stamp: datetime = at(5)
    only = checkpoint_stats_of([cp(5, "x", enqueued_at=None, started_at=stamp)])
    assert only[0].min_enqueued_at == stamp


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"statuses": []}, "at least one status"),
        ({"statuses": ["running"], "max_age": "7d"}, "not a terminal status"),
        ({"statuses": ["completed"]}, "no bound"),
        ({"statuses": ["completed"], "max_age": "7days!"}, "not a duration"),
        ({"statuses": ["completed"], "max_count": -1}, "max_count"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_problem(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        RetentionPolicy(**kwargs)
