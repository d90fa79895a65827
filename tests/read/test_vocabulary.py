"""The fan vocabulary of the read side: fan groups, folded rows, member helpers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from durably._core.models import CHILD_EDGE_PREFIXES
from durably._read.vocabulary import (
    FAN_PAGE_DEFAULT_LIMIT,
    FAN_PAGE_MAX_LIMIT,
    FAN_SUMMARY_FAILURES,
    SUMMARY_CHILD_LIMIT,
    FoldedFailure,
    checkpoint_name_kind,
    child_count,
    child_ids_of,
    fan_declaration,
    folded_child_ids,
    folded_count,
    folded_failures,
    is_failed_member,
    weight,
)

from .builders import child, err, folded, ok, row, spawn, step


def test_constants() -> None:
    assert FAN_SUMMARY_FAILURES == 20
    assert SUMMARY_CHILD_LIMIT == 200
    assert CHILD_EDGE_PREFIXES == ("signal:child:", "fan:", "spawn:")
    assert (FAN_PAGE_DEFAULT_LIMIT, FAN_PAGE_MAX_LIMIT) == (100, 1000)


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        ("all:7", (None, False)),  # legacy / undeclared
        ("all:7:40000", (40000, False)),
        ("all:7:100:ff", (100, True)),
        ("all:7:ff", (None, True)),
        ("gather:7", (None, False)),
        ("all:x:10", (None, False)),  # not ASCII digits
        ("all:7:1x", (None, False)),
        ("all:7:²", (None, False)),  # isdigit() but not ASCII
        ("all:7:٣", (None, False)),
        ("all:7:10:FF", (None, False)),  # case-sensitive mode
        ("all:7:10:ff:ff", (None, True)),  # ff stripped once; 4 parts left → no total
        ("ff", (None, False)),
        ("", (None, False)),
        ("all:7:-1", (None, False)),
        ("all:7:0", (0, False)),
    ],
)
def test_fan_declaration(group: str, expected: tuple[int | None, bool]) -> None:
    assert fan_declaration(group) == expected


def test_checkpoint_name_kind_is_case_sensitive() -> None:
    assert checkpoint_name_kind("signal:child:x") == "child"
    assert checkpoint_name_kind("fan:r.all.1") == "folded"
    assert checkpoint_name_kind("spawn:x") == "spawn"
    assert checkpoint_name_kind("Fan:x") == "step"
    assert checkpoint_name_kind("signal:x") == "step"


def test_folded_count() -> None:
    # edge cases: other rows, malformed outputs
    assert folded_count(child(0, "c")) is None
    assert folded_count(step(0)) is None
    assert folded_count(folded(0, "r.all.0", 0, [ok(1), ok(2), ok(3)])) == 3
    assert folded_count(row(0, "fan:r.all.0", kind="signal", output="garbage")) == 0
    assert folded_count(row(0, "fan:r.all.0", kind="signal", output=None)) == 0
    assert folded_count(folded(0, "p", 0, [], count=-2)) == 0
    assert folded_count(folded(0, "p", 0, [], count=True)) == 0
    assert folded_count(folded(0, "p", 0, [], count=2.0)) == 0


def test_folded_child_ids() -> None:
    cp = folded(4, "r.all.4.w1", 3, [ok(), ok(), ok()])
    assert folded_child_ids(cp) == ["r.all.4.w1.3", "r.all.4.w1.4", "r.all.4.w1.5"]
    # `first` missing / invalid → 0
    bad_first = row(4, "fan:p", kind="signal", output={"count": 2, "first": "x"})
    assert folded_child_ids(bad_first) == ["p.0", "p.1"]
    no_first = row(4, "fan:p", kind="signal", output={"count": 1})
    assert folded_child_ids(no_first) == ["p.0"]
    assert folded_child_ids(step(0)) == []
    assert folded_child_ids(row(0, "fan:p", kind="signal", output=[1])) == []


def test_folded_failures_member_order_and_fields() -> None:
    cp = folded(
        0,
        "r.all.0",
        0,
        [ok(1), err("boom", "declined", {}), ok(3), err("bad")],
    )
    assert folded_failures(cp) == [
        FoldedFailure(id="r.all.0.1", error="boom", code="declined", details={}),
        FoldedFailure(id="r.all.0.3", error="bad"),
    ]
    assert folded_failures(cp)[0].to_json() == {
        "id": "r.all.0.1",
        "error": "boom",
        "code": "declined",
        "details": {},
    }
    assert folded_failures(cp)[1].to_json() == {"id": "r.all.0.3", "error": "bad"}


def test_folded_failures_read_completions_as_given() -> None:
    # Completions beyond `count` still yield failures; fewer than count is fine.
    beyond = folded(0, "p", 10, [ok(), err("x"), err("y")], count=1)
    assert [f.id for f in folded_failures(beyond)] == ["p.11", "p.12"]
    fewer = folded(0, "p", 0, [err("x")], count=5)
    assert [f.id for f in folded_failures(fewer)] == ["p.0"]
    # malformed completions
    assert folded_failures(row(0, "fan:p", kind="signal", output={"count": 2})) == []
    junk = row(0, "fan:p", kind="signal", output={"count": 3, "completions": [1, None, {"ok": 0}]})
    assert folded_failures(junk) == []
    assert folded_failures(child(0, "c", err())) == []


def test_weight() -> None:
    assert weight(step(0)) == 1
    assert weight(child(0, "c")) == 1
    assert weight(spawn(0, "c")) == 1
    assert weight(folded(0, "p", 0, [ok()] * 7)) == 7
    assert weight(row(0, "fan:p", kind="signal", output=None)) == 0


def test_is_failed_member() -> None:
    # failed rows, failed child Completions, folded rows with a failure
    assert is_failed_member(step(0, status="failed"))
    assert not is_failed_member(step(0, status="completed"))
    assert not is_failed_member(step(0, status="pending"))
    assert not is_failed_member(child(0, "c", ok(1)))  # completed, ok:true → not a failure
    assert is_failed_member(child(0, "c", err()))  # completed, ok:false → failure
    assert not is_failed_member(child(0, "c"))  # running placeholder
    # a running row whose output happens to say ok:false is not a settled failure
    assert not is_failed_member(row(0, "signal:child:c", status="running", output=err()))
    assert is_failed_member(folded(0, "p", 0, [ok(), err()]))
    assert not is_failed_member(folded(0, "p", 0, [ok(), ok()]))
    # a step whose output looks like a Completion is judged by status only
    assert not is_failed_member(step(0, output={"ok": False}))
    assert is_failed_member(replace(spawn(0, "x"), status="failed"))


def test_child_ids_of_order_dedup_and_kinds() -> None:
    rows = [
        step(0),
        child(1, "a"),
        spawn(2, "b"),
        folded(3, "r.all.3", 0, [ok(), ok()]),
        spawn(5, None),  # no id
        child(6, "b", ok()),  # duplicate of the spawn
        spawn(7, 42),  # non-string output: skipped
        row(8, "signal:other", kind="signal"),
    ]
    assert child_ids_of(rows) == ["a", "b", "r.all.3.0", "r.all.3.1"]
    assert child_count(rows) == 1 + 1 + 2 + 1 + 1 + 1


def test_start_child_then_child_counts_twice() -> None:
    # edge case: start_child('x') then child(…, 'x')
    rows = [spawn(0, "x"), child(1, "x", ok())]
    assert child_ids_of(rows) == ["x"]
    assert child_count(rows) == 2


def test_spawn_without_id_counts_but_names_nothing() -> None:
    rows = [spawn(0, None)]
    assert child_ids_of(rows) == []
    assert child_count(rows) == 1
