"""Read-side ETags: computation and weak comparison."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime

import pytest

from durably import StepCheckpoint, WorkflowRun
from durably._read.etag import (
    canonical_json,
    canonical_stats,
    etag_matches,
    fan_page_etag,
    parse_entity_tags,
    run_detail_etag,
)
from durably._read.models import FanPageQuery

from .builders import T0, at, child, ok, stats_of, step

RUN = WorkflowRun(
    id="r",
    workflow="checkout",
    workflow_version="1",
    status="running",
    created_at=T0,
    updated_at=T0,
    input={"orderId": "o1"},
)

G = "all:1:5"


def rows() -> list[StepCheckpoint]:
    return [step(0, "prepare"), *[step(1 + i, "charge", group=G) for i in range(5)]]


# ---------------------------------------------------------------- etag_matches

TAG = 'W/"rd-abc123"'


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, False),
        ("", False),
        ("   ", False),
        ("*", True),
        ("  *  ", True),
        ('W/"rd-abc123"', True),
        ('"rd-abc123"', True),  # strong form matches weakly
        ('"x", W/"rd-abc123"', True),
        ('"x",W/"rd-abc123"', True),
        ('"x" ,\tW/"rd-abc123" ', True),
        ('"x", , W/"rd-abc123"', True),  # empty list elements tolerated
        ('"x"', False),
        ('W/"rd-abc12"', False),
        ('"rd-abc123', False),  # unterminated
        ("rd-abc123", False),  # unquoted
        ('w/"rd-abc123"', False),  # W/ is case-sensitive
        ('"x", junk, W/"rd-abc123"', False),  # stop at the first malformed element
        ('W/"rd-abc123", junk', True),  # elements before the malformed one still count
        ('"x" "rd-abc123"', False),  # missing comma: malformed after "x"
        ('"rd-abc123"junk', False),  # junk glued to a tag: that element is malformed
        ('*, "rd-abc123"', False),  # `*` is not a list element
    ],
)
def test_etag_matches(header: str | None, expected: bool) -> None:
    assert etag_matches(header, TAG) is expected


def test_etag_matches_a_strong_etag_weakly() -> None:
    assert etag_matches('W/"a"', '"a"')
    assert etag_matches('"a"', '"a"')
    assert not etag_matches('"b"', '"a"')


def test_parse_entity_tags() -> None:
    assert parse_entity_tags('W/"a", "b",W/""') == ["a", "b", ""]
    assert parse_entity_tags('"a", x, "b"') == ["a"]
    assert parse_entity_tags("") == []


# ---------------------------------------------------------------- run_detail_etag


def test_run_detail_etag_format_and_stability() -> None:
    stats = stats_of(rows())
    tag = run_detail_etag(RUN, stats, 50)
    assert re.fullmatch(r'W/"rd-[0-9a-f]{40}"', tag)
    assert run_detail_etag(RUN, stats_of(rows()), 50) == tag  # identical reads
    assert run_detail_etag(RUN, list(reversed(stats)), 50) == tag  # bucket order
    assert etag_matches(tag, tag)


def test_run_detail_etag_changes_on_any_run_change() -> None:
    stats = stats_of(rows())
    tag = run_detail_etag(RUN, stats, 50)
    changes = [
        replace(RUN, status="completed"),
        replace(RUN, updated_at=at(1)),
        replace(RUN, updated_at=T0.replace(microsecond=2000)),  # 2 ms later
        replace(RUN, locked_by="w1", locked_until=123),
        replace(RUN, search_attributes={"tier": "pro"}),
        replace(RUN, output={"x": 1}),
    ]
    tags = {run_detail_etag(r, stats, 50) for r in changes}
    assert tag not in tags and len(tags) == len(changes)


def test_run_detail_etag_depends_on_over() -> None:
    stats = stats_of(rows())
    assert run_detail_etag(RUN, stats, 50) != run_detail_etag(RUN, stats, 5)


def test_run_detail_etag_changes_on_bucket_change() -> None:
    base = rows()
    tag = run_detail_etag(RUN, stats_of(base), 50)
    failed = [*base[:3], replace(base[3], status="failed"), *base[4:]]
    retried = [*base[:3], replace(base[3], attempts=2), *base[4:]]  # in-place retry
    appended = [*base, step(6, "charge", group=G)]
    renamed = [replace(base[0], name="prepare2"), *base[1:]]
    later = [*base[:5], replace(base[5], finished_at=at(99))]
    for changed in (failed, retried, appended, renamed, later):
        assert run_detail_etag(RUN, stats_of(changed), 50) != tag


def test_payload_rewrite_does_not_move_the_tag() -> None:
    # Accepted trade-off — the buckets do not see payloads.
    base = rows()
    rewritten = [replace(base[0], output={"new": True}), *base[1:]]
    assert run_detail_etag(RUN, stats_of(base), 50) == run_detail_etag(RUN, stats_of(rewritten), 50)


@dataclass(frozen=True)
class Stat:
    """A snake_case CheckpointStat-like object (the store's class is read duck-typed)."""

    group: str | None
    status: str
    name_kind: str
    count: int
    min_seq: int
    max_seq: int
    min_name: str
    max_name: str
    min_enqueued_at: datetime
    min_started_at: datetime
    max_started_at: datetime
    max_finished_at: datetime
    sum_attempts: int


def test_stats_are_read_from_objects_and_mappings_alike() -> None:
    mappings = stats_of(rows())
    objects = [
        Stat(
            group=m["group"],
            status=m["status"],
            name_kind=m["nameKind"],
            count=m["count"],
            min_seq=m["minSeq"],
            max_seq=m["maxSeq"],
            min_name=m["minName"],
            max_name=m["maxName"],
            min_enqueued_at=m["minEnqueuedAt"],
            min_started_at=m["minStartedAt"],
            max_started_at=m["maxStartedAt"],
            max_finished_at=m["maxFinishedAt"],
            sum_attempts=m["sumAttempts"],
        )
        for m in mappings
    ]
    assert canonical_stats(objects) == canonical_stats(mappings)
    assert run_detail_etag(RUN, objects, 3) == run_detail_etag(RUN, mappings, 3)


def test_canonical_json() -> None:
    expected = '{"a":["2026-06-11T00:00:00.000Z","é"],"b":1}'
    assert canonical_json({"b": 1, "a": [T0, "é"]}) == expected


# ---------------------------------------------------------------- fan_page_etag


def test_fan_page_etag_format_and_inputs() -> None:
    stats = stats_of(rows())
    tag = fan_page_etag(G, stats, FanPageQuery(offset=0, limit=10))
    assert re.fullmatch(r'W/"fp-[0-9a-f]{40}"', tag)
    # only the group's buckets count: the whole list or the group's share give one tag
    assert fan_page_etag(G, stats_of(rows(), group=G), {"offset": 0, "limit": 10}) == tag
    # ifNoneMatch is not an input
    assert fan_page_etag(G, stats, FanPageQuery(offset=0, limit=10, if_none_match="*")) == tag
    assert fan_page_etag(G, stats, FanPageQuery(offset=1, limit=10)) != tag
    assert fan_page_etag(G, stats, FanPageQuery(offset=0, limit=11)) != tag
    assert fan_page_etag(G, stats, FanPageQuery(limit=10, failed_only=True)) != tag
    assert fan_page_etag("all:9", stats, FanPageQuery(limit=10)) != tag


def test_fan_page_queries_that_clamp_alike_share_a_tag() -> None:
    stats = stats_of(rows())
    a = fan_page_etag(G, stats, {"limit": 10**9, "offset": -3})
    b = fan_page_etag(G, stats, {"limit": 1000, "offset": 0})
    c = fan_page_etag(G, stats, None)
    d = fan_page_etag(G, stats, {"limit": "abc"})
    assert a == b
    assert c == d


def test_fan_page_etag_ignores_other_groups_changes() -> None:
    base = rows()
    tag = fan_page_etag(G, stats_of(base), None)
    other = [replace(base[0], status="failed"), *base[1:], child(9, "c", ok(), group="all:9")]
    assert fan_page_etag(G, stats_of(other), None) == tag


def test_new_member_changes_the_fan_page_tag() -> None:
    base = rows()
    tag = fan_page_etag(G, stats_of(base), None)
    assert fan_page_etag(G, stats_of([*base, step(6, "charge", group=G)]), None) != tag
