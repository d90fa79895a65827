"""State-store cases: persisted schedule records (`ScheduleStore`) — reads back as written,
insert-only and compare-and-set writes (one winner of a race), the due scan and its order,
filters and pages, deletes, and refused arguments.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from durably import SerializationError, StateStore
from durably._core.schedules import ScheduleQuery, ScheduleRecord, ScheduleSpec, ScheduleState

from .base import StoreCases


def schedule_record(sid: str, **kw: Any) -> ScheduleRecord:
    """A schedule record of workflow "report" every minute, due at 60 s; `kw` replaces
    fields."""
    fields: dict[str, Any] = {
        "id": sid,
        "workflow": "report",
        "namespace": "default",
        "paused": False,
        "next_fire_at": 60_000,
        "created_at": 1_000,
        "updated_at": 1_000,
        "spec": ScheduleSpec(input={"team": "ops"}, every_ms=60_000, overlap="allow"),
        "state": ScheduleState(fired_count=0, recent_runs=[]),
    }
    fields.update(kw)
    return ScheduleRecord(**fields)


class ScheduleCases(StoreCases):
    """The schedule-record cases of the state-store suite."""

    async def test_a_record_reads_back_as_written(self, store: StateStore) -> None:
        written = schedule_record(
            "nightly",
            spec=ScheduleSpec(
                input={"team": "ops", "n": [1, 2.5, None]},
                cron="30 2 * * *",
                timezone="Europe/Berlin",
                jitter_ms=5_000,
                max_catchup=2,
                tags=["a", "b"],
                search_attributes={"env": "prod", "tier": 2},
            ),
            state=ScheduleState(last_run_id="sched:nightly:60000", recent_runs=["x"], note="hi"),
        )
        assert await store.put_schedule(written) is True
        got = await store.get_schedule("nightly")
        assert got == written
        assert got is not written
        assert await store.get_schedule("other") is None

    async def test_if_absent_inserts_only_once(self, store: StateStore) -> None:
        assert await store.put_schedule(schedule_record("s"), if_absent=True) is True
        assert (
            await store.put_schedule(schedule_record("s", workflow="other"), if_absent=True)
            is False
        )
        got = await store.get_schedule("s")
        assert got is not None and got.workflow == "report"
        # A plain put is an upsert.
        assert await store.put_schedule(schedule_record("s", workflow="other", paused=True)) is True
        got = await store.get_schedule("s")
        assert got is not None and got.workflow == "other" and got.paused is True

    async def test_compare_and_set_wins_only_on_the_version_it_read(
        self, store: StateStore
    ) -> None:
        await store.put_schedule(schedule_record("s", updated_at=5))
        assert (
            await store.put_schedule(
                schedule_record("s", updated_at=6, next_fire_at=1), expected_updated_at=4
            )
            is False
        )
        got = await store.get_schedule("s")
        assert got is not None and got.updated_at == 5 and got.next_fire_at == 60_000
        assert (
            await store.put_schedule(
                schedule_record("s", updated_at=6, next_fire_at=1), expected_updated_at=5
            )
            is True
        )
        got = await store.get_schedule("s")
        assert got is not None and got.updated_at == 6 and got.next_fire_at == 1
        # A record that is gone is never recreated by a compare-and-set.
        assert (
            await store.put_schedule(schedule_record("gone", updated_at=2), expected_updated_at=1)
            is False
        )
        assert await store.get_schedule("gone") is None

    async def test_racing_compare_and_sets_from_one_read_have_one_winner(
        self, store: StateStore
    ) -> None:
        await store.put_schedule(schedule_record("s", updated_at=10))
        read = await store.get_schedule("s")
        assert read is not None
        attempts = [
            store.put_schedule(
                dataclasses.replace(read, updated_at=11 + i, state=ScheduleState(fired_count=i)),
                expected_updated_at=read.updated_at,
            )
            for i in range(8)
        ]
        results = await asyncio.gather(*attempts)
        assert results.count(True) == 1
        got = await store.get_schedule("s")
        assert got is not None
        winner = results.index(True)
        assert got.updated_at == 11 + winner and got.state == {"fired_count": winner}

    async def test_both_write_modes_at_once_are_refused(self, store: StateStore) -> None:
        with pytest.raises(ValueError, match="cannot be combined"):
            await store.put_schedule(schedule_record("s"), if_absent=True, expected_updated_at=1)
        assert await store.get_schedule("s") is None

    async def test_a_spec_that_is_not_json_is_refused_and_nothing_is_written(
        self, store: StateStore
    ) -> None:
        with pytest.raises(SerializationError):
            await store.put_schedule(schedule_record("s", spec=ScheduleSpec(input=float("nan"))))
        with pytest.raises(SerializationError):
            await store.put_schedule(schedule_record("s", spec=ScheduleSpec(input={1, 2})))
        assert await store.get_schedule("s") is None

    async def test_delete_says_whether_a_record_went(self, store: StateStore) -> None:
        await store.put_schedule(schedule_record("s"))
        assert await store.delete_schedule("s") is True
        assert await store.delete_schedule("s") is False
        assert await store.get_schedule("s") is None

    async def test_the_due_scan_orders_by_next_fire_then_id_with_none_last(
        self, store: StateStore
    ) -> None:
        await store.put_schedule(schedule_record("late", next_fire_at=300))
        await store.put_schedule(schedule_record("b-early", next_fire_at=100))
        await store.put_schedule(schedule_record("a-early", next_fire_at=100))
        await store.put_schedule(schedule_record("idle", next_fire_at=None))
        await store.put_schedule(schedule_record("paused", next_fire_at=50, paused=True))
        await store.put_schedule(schedule_record("other-ns", next_fire_at=10, namespace="acme"))
        every = await store.list_schedules(ScheduleQuery())
        assert [r.id for r in every] == ["other-ns", "paused", "a-early", "b-early", "late", "idle"]
        due = await store.list_schedules(
            ScheduleQuery(namespace="default", paused=False, due_before=300)
        )
        assert [r.id for r in due] == ["a-early", "b-early", "late"]
        assert [r.id for r in await store.list_schedules(ScheduleQuery(due_before=99))] == [
            "other-ns",
            "paused",
        ]
        assert [r.id for r in await store.list_schedules(ScheduleQuery(paused=True))] == ["paused"]

    async def test_filters_by_workflow_and_pages(self, store: StateStore) -> None:
        for i in range(5):
            await store.put_schedule(
                schedule_record(f"s{i}", next_fire_at=i, workflow="a" if i % 2 else "b")
            )
        assert [r.id for r in await store.list_schedules(ScheduleQuery(workflow="a"))] == [
            "s1",
            "s3",
        ]
        page = await store.list_schedules(ScheduleQuery(limit=2, offset=1))
        assert [r.id for r in page] == ["s1", "s2"]
        assert await store.list_schedules(ScheduleQuery(limit=0)) == []

    async def test_a_negative_page_is_refused(self, store: StateStore) -> None:
        with pytest.raises(ValueError, match=r"ScheduleQuery\.limit"):
            await store.list_schedules(ScheduleQuery(limit=-1))
        with pytest.raises(ValueError, match=r"ScheduleQuery\.offset"):
            await store.list_schedules(ScheduleQuery(offset=-1))
