"""Property tests of the in-memory read path (fan vocabulary, summaries, pages, etags) over
realistic timelines (tests/read/strategies.py). The store-vs-memory equivalence
(tests/read/test_store_path.py) reuses the same strategies."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("hypothesis")

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durably import RunDetail, StepCheckpoint, WorkflowRun
from durably._read.etag import fan_page_etag, run_detail_etag
from durably._read.models import FanPageQuery
from durably._read.summarize import (
    fan_page_bounds,
    page_fan,
    summarize_run_in_memory,
    summarize_timeline,
)
from durably._read.vocabulary import (
    FAN_SUMMARY_FAILURES,
    SUMMARY_CHILD_LIMIT,
    checkpoint_name_kind,
    child_count,
    child_ids_of,
    fan_declaration,
    is_failed_member,
    weight,
)

from .builders import T0, stats_of
from .strategies import fan_page_queries, groups_of, overs, timelines

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

RUN = WorkflowRun(
    id="r", workflow="w", workflow_version="1", status="running", created_at=T0, updated_at=T0
)


def members(rows: list[StepCheckpoint], group: str) -> list[StepCheckpoint]:
    return [cp for cp in rows if cp.parallel_group == group]


@FAST
@given(timelines())
def test_strategy_yields_consistent_timelines(rows: list[StepCheckpoint]) -> None:
    seqs = [cp.seq for cp in rows]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    for cp in rows:
        assert cp.step_id == f"{cp.run_id}:{cp.seq}"
        assert cp.started_at <= cp.finished_at
    for g in groups_of(rows):
        group_rows = members(rows, g)
        total, _ = fan_declaration(g)
        first = int(g.split(":")[1])
        assert all(cp.seq >= first for cp in group_rows)
        if total is not None:  # rows stay inside the claimed range, weights within total
            assert all(cp.seq < first + total for cp in group_rows)
            assert sum(weight(cp) for cp in group_rows) <= total


@FAST
@given(timelines(), overs())
def test_summary_partitions_the_timeline(rows: list[StepCheckpoint], over: int) -> None:
    s = summarize_timeline(rows, over)
    wide = {f.group for f in s.fans}
    # kept rows + members of wide fans = every row, once
    assert [cp for cp in rows if cp.parallel_group not in wide] == list(s.timeline)
    assert all(cp.parallel_group not in wide for cp in s.timeline)
    # every group left in the timeline is narrow, every summarised one wide
    for g in groups_of(rows):
        size = sum(weight(cp) for cp in members(rows, g))
        total = fan_declaration(g)[0]
        is_wide = size > over or (total is not None and total > over)
        assert (g in wide) is is_wide
    assert [f.first_seq for f in s.fans] == sorted(f.first_seq for f in s.fans)


@FAST
@given(timelines(), overs())
def test_fan_summary_invariants(rows: list[StepCheckpoint], over: int) -> None:
    for fan in summarize_timeline(rows, over).fans:
        group_rows = members(rows, fan.group)
        assert sum(fan.counts.values()) == fan.size  # folds are well formed here
        assert all(n > 0 for n in fan.counts.values())
        assert fan.size == sum(weight(cp) for cp in group_rows)
        assert (fan.first_seq, fan.last_seq) == (group_rows[0].seq, group_rows[-1].seq)
        total, fail_fast = fan_declaration(fan.group)
        assert (fan.total, fan.fail_fast) == (total, fail_fast)
        if total is None:
            assert fan.not_started is None
        else:
            assert fan.not_started == max(0, total - fan.size)
        failed_rows = [cp for cp in group_rows if is_failed_member(cp)]
        assert list(fan.failures) == failed_rows[:FAN_SUMMARY_FAILURES]
        assert len(failed_rows) <= fan.counts.get("failed", 0)
        in_flight = fan.counts.get("pending", 0) + fan.counts.get("running", 0)
        if in_flight:
            assert fan.finished_at is None
        if fan.finished_at is not None:
            assert fan.finished_at == max(cp.finished_at for cp in group_rows)
        assert fan.started_at == min(cp.enqueued_at or cp.started_at for cp in group_rows)
        steps = {cp.name for cp in group_rows if checkpoint_name_kind(cp.name) == "step"}
        if not steps:
            assert fan.label == "child runs"
        else:
            assert fan.label == (steps.pop() if len(steps) == 1 else "steps")


@FAST
@given(timelines(), overs(), st.randoms(use_true_random=False))
def test_run_summary_is_order_independent_and_counts_children(
    rows: list[StepCheckpoint], over: int, rnd: random.Random
) -> None:
    s = summarize_run_in_memory(rows, over)
    shuffled = list(rows)
    rnd.shuffle(shuffled)
    assert summarize_run_in_memory(shuffled, over) == s
    ids = child_ids_of(rows)
    assert list(s.children) == ids[:SUMMARY_CHILD_LIMIT]
    assert s.child_count == child_count(rows)
    assert len(ids) <= s.child_count  # every id comes from a row weighing at least one
    # the JSON form of the detail round-trips
    detail = RunDetail(
        run=RUN, timeline=s.timeline, children=s.children, fans=s.fans, child_count=s.child_count
    )
    assert RunDetail.from_json(detail.to_json()).to_json() == detail.to_json()


@FAST
@given(timelines(), st.booleans(), st.integers(1, 7))
def test_paging_covers_every_member_once(
    rows: list[StepCheckpoint], failed_only: bool, limit: int
) -> None:
    for g in groups_of(rows):
        expected = members(rows, g)
        if failed_only:
            expected = [cp for cp in expected if is_failed_member(cp)]
        seen: list[StepCheckpoint] = []
        offset = 0
        while True:
            query = FanPageQuery(offset=offset, limit=limit, failed_only=failed_only)
            page = page_fan(rows, g, query)
            assert page.total == len(expected)
            assert len(page.items) <= limit
            assert page.etag is None and not page.not_modified
            if not page.items:
                break
            seen.extend(page.items)
            offset += limit
        assert seen == expected
        if failed_only:
            assert all(is_failed_member(cp) for cp in seen)


@FAST
@given(timelines(), fan_page_queries())
def test_any_query_shape_pages_a_slice(rows: list[StepCheckpoint], query: FanPageQuery) -> None:
    offset, limit = fan_page_bounds(query)
    assert offset >= 0 and 1 <= limit <= 1000
    for g in [*groups_of(rows), "all:unknown"]:
        page = page_fan(rows, g, query)
        expected = members(rows, g)
        if query.failed_only:
            expected = [cp for cp in expected if is_failed_member(cp)]
        assert page.total == len(expected)
        assert list(page.items) == expected[offset : offset + limit]


@FAST
@given(timelines(), st.data())
def test_etags_move_when_a_row_changes(rows: list[StepCheckpoint], data: st.DataObject) -> None:
    stats = stats_of(rows)
    shuffled = list(stats)
    data.draw(st.randoms(use_true_random=False)).shuffle(shuffled)
    assert run_detail_etag(RUN, shuffled, 5) == run_detail_etag(RUN, stats, 5)
    if not rows:
        return
    i = data.draw(st.integers(0, len(rows) - 1))
    old = rows[i]
    statuses = [s for s in ("pending", "running", "completed", "failed") if s != old.status]
    new_status = data.draw(st.sampled_from(statuses))
    changed = [*rows[:i], replace(old, status=new_status), *rows[i + 1 :]]
    assert run_detail_etag(RUN, stats_of(changed), 5) != run_detail_etag(RUN, stats, 5)
    retried = [*rows[:i], replace(old, attempts=old.attempts + 1), *rows[i + 1 :]]
    assert run_detail_etag(RUN, stats_of(retried), 5) != run_detail_etag(RUN, stats, 5)
    if old.parallel_group is not None:
        g = old.parallel_group
        query = FanPageQuery(limit=10)
        assert fan_page_etag(g, stats_of(changed), query) != fan_page_etag(g, stats, query)
        # a change elsewhere does not move this group's page tag
        others = [cp for cp in rows if cp.parallel_group != g]
        if others:
            j = rows.index(others[0])
            moved = [*rows[:j], replace(rows[j], attempts=rows[j].attempts + 1), *rows[j + 1 :]]
            assert fan_page_etag(g, stats_of(moved), query) == fan_page_etag(g, stats, query)
