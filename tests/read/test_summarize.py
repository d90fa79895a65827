"""The in-memory read path: summarize_fan, summarize_timeline, summarize_run_in_memory, paging."""

from __future__ import annotations

import math
from typing import Any

import pytest

from durably import StepCheckpoint
from durably._read.models import FanPageQuery
from durably._read.summarize import (
    fan_page_bounds,
    page_fan,
    summarize_fan,
    summarize_run_in_memory,
    summarize_timeline,
)

from .builders import at, child, err, folded, ok, row, spawn, step


def step_fan(
    first: int, n: int, group: str, *, name: str = "charge", failed: set[int] | None = None
) -> list[StepCheckpoint]:
    failed = failed or set()
    return [
        step(first + i, name, "failed" if i in failed else "completed", group=group)
        for i in range(n)
    ]


# ---------------------------------------------------------------- summarize_fan


def test_summarize_fan_every_field_of_a_settled_step_fan() -> None:
    g = "all:3:4"
    members = [
        step(3, "charge", group=g, enqueued=1, started=3, finished=10),
        step(4, "charge", "failed", group=g, started=4, finished=12),
        step(5, "charge", group=g, started=5, finished=11),
        step(6, "charge", group=g, enqueued=2, started=6, finished=9),
    ]
    s = summarize_fan(g, members)
    assert s.group == g
    assert s.label == "charge"
    assert (s.first_seq, s.last_seq) == (3, 6)
    assert s.size == 4
    assert s.total == 4
    assert s.not_started == 0
    assert s.fail_fast is False
    assert dict(s.counts) == {"completed": 3, "failed": 1}
    assert s.started_at == at(1)  # earliest enqueuedAt (falls back to startedAt)
    assert s.finished_at == at(12)
    assert s.failures == (members[1],)
    assert s.to_json() == {
        "group": g,
        "label": "charge",
        "firstSeq": 3,
        "lastSeq": 6,
        "size": 4,
        "total": 4,
        "notStarted": 0,
        "failFast": False,
        "counts": {"completed": 3, "failed": 1},
        "startedAt": "2026-06-11T00:00:01.000Z",
        "finishedAt": "2026-06-11T00:00:12.000Z",
        "failures": [members[1].to_json()],
    }


def test_started_at_falls_back_to_started_at() -> None:
    members = [step(5, group="all:5", started=8), step(6, group="all:5", started=7)]
    assert summarize_fan("all:5", members).started_at == at(7)


def test_members_are_read_in_seq_order() -> None:
    members = [
        step(9, status="failed", group="g"),
        step(2, group="g"),
        step(4, status="failed", group="g"),
    ]
    s = summarize_fan("g", members)
    assert (s.first_seq, s.last_seq) == (2, 9)
    assert [cp.seq for cp in s.failures] == [4, 9]


def test_summarize_fan_rejects_empty_members() -> None:
    with pytest.raises(ValueError):
        summarize_fan("all:1", [])


def test_undeclared_fan_has_no_total_or_not_started() -> None:
    s = summarize_fan("all:0", step_fan(0, 3, "all:0"))
    assert s.total is None and s.not_started is None
    js = s.to_json()
    assert "total" not in js and "notStarted" not in js
    assert s.finished_at is not None  # settled: nothing pending/running, nothing declared


def test_labels() -> None:
    # common step name; mixed names → 'steps'; no step members → 'child runs'
    assert summarize_fan("g", step_fan(0, 3, "g", name="resize")).label == "resize"
    mixed = [step(0, "a", group="g"), step(1, "b", group="g")]
    assert summarize_fan("g", mixed).label == "steps"
    children = [child(0, "r.all.0.0", ok(), group="g"), child(1, "r.all.0.1", group="g")]
    assert summarize_fan("g", children).label == "child runs"
    folded_only = [folded(0, "r.all.0", 0, [ok()], group="g")]
    assert summarize_fan("g", folded_only).label == "child runs"
    spawns = [spawn(0, "x", group="g"), spawn(1, "y", group="g")]
    assert summarize_fan("g", spawns).label == "child runs"
    # step members decide the label even next to child rows
    with_child = [child(0, "c", ok(), group="g"), step(1, "resize", group="g")]
    assert summarize_fan("g", with_child).label == "resize"


def test_child_fan_counts_failed_completions_and_running_placeholders() -> None:
    g = "all:0:5"
    members = [
        child(0, "r.all.0.0", ok(1), group=g),
        child(1, "r.all.0.1", err("boom", "declined"), group=g),
        child(2, "r.all.0.2", group=g),  # running placeholder
        child(3, "r.all.0.3", ok(2), group=g),
        row(4, "signal:child:r.all.0.4", status="failed", kind="signal", group=g),
    ]
    s = summarize_fan(g, members)
    assert dict(s.counts) == {"completed": 2, "failed": 2, "running": 1}
    assert s.failures == (members[1], members[4])
    assert s.finished_at is None  # a member is running
    assert s.size == 5 and s.not_started == 0


def test_folded_counts_and_size() -> None:
    g = "all:0:10:ff"
    members = [
        folded(0, "r.all.0.w0", 0, [ok(), ok(), err("x")], group=g),
        folded(3, "r.all.0.w1", 3, [ok(), ok(), ok()], group=g),
        child(6, "r.all.0.w2.6", ok(), group=g),
        child(7, "r.all.0.w2.7", group=g),
    ]
    s = summarize_fan(g, members)
    assert s.size == 8
    assert s.total == 10 and s.not_started == 2 and s.fail_fast
    assert dict(s.counts) == {"completed": 6, "failed": 1, "running": 1}
    assert s.failures == (members[0],)


def test_folded_counts_never_negative_and_zero_keys_absent() -> None:
    # more failures than count: completed clamps at 0 and stays absent
    g = "g"
    members = [folded(0, "p", 0, [err(), err(), err()], count=1, group=g)]
    s = summarize_fan(g, members)
    assert dict(s.counts) == {"failed": 3}
    assert s.size == 1
    empty = summarize_fan(g, [folded(0, "p", 0, [], group=g)])
    assert dict(empty.counts) == {}
    assert empty.size == 0


def test_declared_wider_fan_not_started() -> None:
    # edge: `all:7:40000` with 3 members
    g = "all:7:40000"
    s = summarize_fan(g, step_fan(7, 3, g))
    assert (s.size, s.total, s.not_started) == (3, 40000, 39997)
    assert s.finished_at is None  # waves not yet sent


def test_fail_fast_fan_stopped_early_is_finished() -> None:
    # edge: `all:7:100:ff` stopped after a failure in its first wave of 10
    g = "all:7:100:ff"
    wave = [child(7 + i, f"r.all.7.w0.{i}", ok(), group=g) for i in range(10)]
    wave[3] = child(10, "r.all.7.w0.3", err(), group=g)
    in_flight = [*wave[:9], child(16, "r.all.7.w0.9", group=g)]
    assert summarize_fan(g, in_flight).finished_at is None  # not yet settled
    s = summarize_fan(g, wave)
    assert s.not_started == 90
    assert s.finished_at == max(cp.finished_at for cp in wave)


def test_wait_all_fan_between_waves_has_no_finished_at() -> None:
    g = "all:0:20"
    wave = [child(i, f"r.all.0.w0.{i}", err() if i == 2 else ok(), group=g) for i in range(10)]
    s = summarize_fan(g, wave)
    assert s.not_started == 10
    assert s.counts["failed"] == 1
    assert s.finished_at is None  # waitAll, not failFast: more waves to come


def test_fail_fast_without_failure_between_waves_not_finished() -> None:
    g = "all:0:20:ff"
    s = summarize_fan(g, step_fan(0, 10, g))
    assert s.finished_at is None


def test_pending_member_blocks_finished_at() -> None:
    g = "all:0:2"
    s = summarize_fan(g, [step(0, group=g), step(1, status="pending", group=g)])
    assert dict(s.counts) == {"completed": 1, "pending": 1}
    assert s.finished_at is None
    assert "finishedAt" not in s.to_json()


def test_failures_cap_at_20_in_seq_order() -> None:
    # edge: 25 failed members → the first 20 by seq
    g = "all:0:30"
    members = step_fan(0, 30, g, failed=set(range(5, 30)))
    s = summarize_fan(g, list(reversed(members)))
    assert [cp.seq for cp in s.failures] == list(range(5, 25))
    assert s.counts["failed"] == 25


# ---------------------------------------------------------------- summarize_timeline


def test_wide_by_size_leaves_the_timeline() -> None:
    # edge: 40 000 steps, over=50 → one FanSummary, the rows leave the timeline
    g = "all:1:40000"
    rows = [step(0, "prepare"), *step_fan(1, 40000, g), step(40001, "report")]
    s = summarize_timeline(rows, 50)
    assert [f.group for f in s.fans] == [g]
    assert s.fans[0].size == 40000
    assert [cp.name for cp in s.timeline] == ["prepare", "report"]


def test_wide_by_declaration() -> None:
    g = "all:7:40000"
    s = summarize_timeline(step_fan(7, 3, g), 50)
    assert len(s.fans) == 1 and s.fans[0].not_started == 39997
    assert s.timeline == ()


def test_exactly_over_members_is_not_summarised() -> None:
    rows = step_fan(0, 5, "all:0")
    s = summarize_timeline(rows, 5)
    assert s.fans == () and s.timeline == tuple(rows)
    s6 = summarize_timeline(step_fan(0, 6, "all:0"), 5)
    assert len(s6.fans) == 1
    # declared exactly over: not wider
    assert summarize_timeline(step_fan(0, 2, "all:0:5"), 5).fans == ()


def test_over_zero_summarises_every_group() -> None:
    rows = [step(0), *step_fan(1, 1, "all:1"), child(2, "c", ok(), group="all:2")]
    s = summarize_timeline(rows, 0)
    assert [f.group for f in s.fans] == ["all:1", "all:2"]
    assert [cp.seq for cp in s.timeline] == [0]


def test_folded_rows_weigh_their_count() -> None:
    # one folded row of 60 children is wider than 50 although it is one row
    g = "all:0"
    rows = [folded(0, "r.all.0", 0, [ok()] * 60, group=g)]
    s = summarize_timeline(rows, 50)
    assert len(s.fans) == 1 and s.fans[0].size == 60
    # a folded row with a malformed output weighs 0
    zero = [row(0, "fan:r.all.0", kind="signal", group=g, output=None)]
    assert summarize_timeline(zero, 0).fans == ()


def test_fans_ordered_by_first_seq_and_small_groups_untouched() -> None:
    big_late = step_fan(100, 10, "all:100")
    small = step_fan(50, 2, "all:50")
    big_early = step_fan(10, 10, "zzz")  # group string sorts after "all:100"
    ungrouped = [step(0, "a"), step(200, "b")]
    rows = sorted([*big_late, *small, *big_early, *ungrouped], key=lambda cp: cp.seq)
    s = summarize_timeline(rows, 5)
    assert [f.group for f in s.fans] == ["zzz", "all:100"]
    assert s.timeline == tuple([ungrouped[0], *small, ungrouped[1]])


def test_timeline_keeps_input_order() -> None:
    rows = [step(3, "c"), step(1, "a"), *step_fan(4, 3, "g"), step(2, "b")]
    s = summarize_timeline(rows, 1)
    assert [cp.name for cp in s.timeline] == ["c", "a", "b"]


def test_no_groups_no_fans() -> None:
    rows = [step(0), step(1)]
    s = summarize_timeline(rows, 0)
    assert s.fans == () and s.timeline == tuple(rows)
    assert summarize_timeline([], 0).fans == ()


# ---------------------------------------------------------------- summarize_run_in_memory


def test_run_summary_children_over_the_full_list() -> None:
    g = "all:1:300"
    fan = [child(1 + i, f"r.all.1.{i}", ok(), group=g) for i in range(250)]
    rows = [spawn(0, "first"), *fan, folded(300, "r.all.1.w9", 250, [ok()] * 50, group=g)]
    s = summarize_run_in_memory(rows, 50)
    assert len(s.fans) == 1 and s.fans[0].size == 300
    assert [cp.seq for cp in s.timeline] == [0]
    assert len(s.children) == 200
    assert s.children[:2] == ("first", "r.all.1.0")
    assert s.child_count == 1 + 250 + 50


def test_run_summary_reads_rows_in_seq_order() -> None:
    rows = [spawn(5, "late"), spawn(1, "early")]
    s = summarize_run_in_memory(rows, 10)
    assert s.children == ("early", "late")
    assert [cp.seq for cp in s.timeline] == [1, 5]


def test_run_summary_of_an_empty_run() -> None:
    s = summarize_run_in_memory([], 0)
    assert (s.timeline, s.fans, s.children, s.child_count) == ((), (), (), 0)


# ---------------------------------------------------------------- fan_page_bounds


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({}, (0, 100)),
        (None, (0, 100)),
        ({"offset": 10, "limit": 5}, (10, 5)),
        ({"limit": 0}, (0, 1)),
        ({"limit": 10**9}, (0, 1000)),
        ({"offset": -3}, (0, 100)),
        ({"limit": "abc"}, (0, 100)),
        ({"limit": "5", "offset": "5"}, (0, 100)),  # strings are not numbers
        ({"limit": True, "offset": True}, (0, 100)),  # nor are booleans
        ({"limit": 2.9, "offset": 3.7}, (3, 2)),  # floor
        ({"limit": -5}, (0, 1)),
        ({"limit": -0.5}, (0, 1)),
        ({"offset": -0.5}, (0, 100)),
        ({"limit": math.nan, "offset": math.nan}, (0, 100)),
        ({"limit": math.inf, "offset": math.inf}, (0, 100)),
        ({"limit": -math.inf}, (0, 100)),
        ({"limit": 1000.5}, (0, 1000)),
        ({"offset": 0.0}, (0, 100)),
    ],
)
def test_fan_page_bounds(query: Any, expected: tuple[int, int]) -> None:
    assert fan_page_bounds(query) == expected


def test_fan_page_bounds_takes_the_query_object() -> None:
    assert fan_page_bounds(FanPageQuery(offset=4, limit=7)) == (4, 7)
    assert fan_page_bounds(FanPageQuery()) == (0, 100)


# ---------------------------------------------------------------- page_fan


def test_page_fan_offset_limit() -> None:
    # edge: offset 10, limit 5 over 12 members → 2 items, total 12
    g = "all:0:12"
    rows = [step(100, "other"), *step_fan(0, 12, g)]
    page = page_fan(rows, g, {"offset": 10, "limit": 5})
    assert [cp.seq for cp in page.items] == [10, 11]
    assert page.total == 12
    assert page.etag is None and not page.not_modified
    assert page.to_json() == {"items": [cp.to_json() for cp in page.items], "total": 12}


def test_page_fan_sorts_by_seq() -> None:
    g = "g"
    rows = list(reversed(step_fan(0, 5, g)))
    assert [cp.seq for cp in page_fan(rows, g, FanPageQuery(limit=3)).items] == [0, 1, 2]


def test_page_fan_failed_only_counts_only_failed_rows() -> None:
    g = "all:0:8"
    rows = [
        *step_fan(0, 4, g, failed={1, 3}),
        child(4, "c4", err(), group=g),
        child(5, "c5", ok(), group=g),
        folded(6, "r.all.0.w3", 6, [ok(), err()], group=g),
        folded(8, "r.all.0.w4", 8, [ok(), ok()], group=g),
        child(10, "c10", group=g),
    ]
    page = page_fan(rows, g, FanPageQuery(failed_only=True))
    assert [cp.seq for cp in page.items] == [1, 3, 4, 6]
    assert page.total == 4
    page2 = page_fan(rows, g, FanPageQuery(failed_only=True, offset=3, limit=10))
    assert [cp.seq for cp in page2.items] == [6] and page2.total == 4
    # folded rows are one item each in an unfiltered page
    assert page_fan(rows, g).total == 9


def test_page_fan_unknown_group_and_if_none_match_ignored() -> None:
    rows = step_fan(0, 3, "all:0")
    assert page_fan(rows, "all:99", None).to_json() == {"items": [], "total": 0}
    page = page_fan(rows, "all:0", FanPageQuery(if_none_match="*"))
    assert page.total == 3 and len(page.items) == 3 and not page.not_modified


def test_page_fan_offset_past_the_end() -> None:
    rows = step_fan(0, 3, "all:0")
    page = page_fan(rows, "all:0", {"offset": 50})
    assert page.items == () and page.total == 3
