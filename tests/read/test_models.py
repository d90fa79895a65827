"""JSON shapes of the read-side objects (run detail, fan summaries, fan pages)."""

from __future__ import annotations

from datetime import UTC, datetime

from durably import FanPage, FanSummary, RunDetail, WorkflowRun
from durably._read.models import FanPageQuery, RunDetailOptions, iso_ms, parse_iso

from .builders import T0, at, step

RUN = WorkflowRun(
    id="r", workflow="w", workflow_version="1", status="running", created_at=T0, updated_at=T0
)


def test_iso_ms_is_to_iso_string() -> None:
    assert iso_ms(datetime(2026, 6, 11, 1, 2, 3, 456789, tzinfo=UTC)) == "2026-06-11T01:02:03.456Z"
    assert iso_ms(datetime(2026, 6, 11)) == "2026-06-11T00:00:00.000Z"  # naive = UTC
    assert parse_iso("2026-06-11T00:00:01.000Z") == at(1)
    assert parse_iso(None) is None


# StepCheckpoint.from_json fills enqueuedAt from startedAt, so rows round-trip by JSON.


def test_unsummarised_detail_json_omits_optional_fields() -> None:
    d = RunDetail(run=RUN, timeline=(step(0),), children=("c",))
    assert d.to_json() == {
        "run": RUN.to_json(),
        "timeline": [step(0).to_json()],
        "children": ["c"],
    }
    assert RunDetail.from_json(d.to_json()).to_json() == d.to_json()


def test_summarised_detail_json() -> None:
    fan = FanSummary(
        group="all:1:3",
        label="charge",
        first_seq=1,
        last_seq=3,
        size=3,
        total=3,
        not_started=0,
        fail_fast=False,
        counts={"completed": 2, "failed": 1},
        started_at=at(1),
        finished_at=at(9),
        failures=(step(2, status="failed", group="all:1:3"),),
    )
    d = RunDetail(run=RUN, timeline=(), children=(), fans=(fan,), child_count=0, etag='W/"rd-x"')
    js = d.to_json()
    assert js["fans"] == [fan.to_json()]
    assert js["childCount"] == 0 and js["etag"] == 'W/"rd-x"'
    assert "notModified" not in js
    assert RunDetail.from_json(js).to_json() == js
    # summarised with no wide fan: `fans: []` is present
    assert RunDetail(run=RUN, fans=(), child_count=0).to_json()["fans"] == []


def test_not_modified_detail_json() -> None:
    d = RunDetail(run=RUN, etag='W/"rd-x"', not_modified=True)
    assert d.to_json() == {
        "run": RUN.to_json(),
        "timeline": [],
        "children": [],
        "etag": 'W/"rd-x"',
        "notModified": True,
    }
    assert RunDetail.from_json(d.to_json()).to_json() == d.to_json()


def test_fan_summary_minimal_json() -> None:
    fan = FanSummary(group="g", label="child runs", first_seq=0, last_seq=0, size=1, fail_fast=True)
    assert fan.to_json() == {
        "group": "g",
        "label": "child runs",
        "firstSeq": 0,
        "lastSeq": 0,
        "size": 1,
        "failFast": True,
        "counts": {},
        "failures": [],
    }
    assert FanSummary.from_json(fan.to_json()) == fan


def test_fan_page_and_query_json() -> None:
    page = FanPage(items=(step(3, group="g"),), total=7, etag='W/"fp-x"')
    items = [step(3, group="g").to_json()]
    assert page.to_json() == {"items": items, "total": 7, "etag": 'W/"fp-x"'}
    assert FanPage.from_json(page.to_json()).to_json() == page.to_json()
    nm = FanPage(etag='W/"fp-x"', not_modified=True)
    assert nm.to_json() == {"items": [], "total": 0, "etag": 'W/"fp-x"', "notModified": True}
    q = FanPageQuery(offset=5, limit=10, failed_only=True, if_none_match="*")
    assert q.to_json() == {"offset": 5, "limit": 10, "failedOnly": True, "ifNoneMatch": "*"}
    assert FanPageQuery.from_json(q.to_json()) == q
    assert FanPageQuery().to_json() == {}
    assert FanPageQuery.coerce(None) == FanPageQuery()
    assert FanPageQuery.coerce(q) is q


def test_run_detail_options_json() -> None:
    o = RunDetailOptions(summarize_fans_over=50, if_none_match='W/"rd-x"')
    assert o.to_json() == {"summarizeFansOver": 50, "ifNoneMatch": 'W/"rd-x"'}
    assert RunDetailOptions.from_json(o.to_json()) == o
    assert RunDetailOptions().to_json() == {}
