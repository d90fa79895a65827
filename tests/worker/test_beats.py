"""A worker's heartbeat row: written as the engine opens (before a start could ask), kept
fresh by one upsert per interval, removed at close, and a store that refuses a beat is
logged once per failing streak. Plus what an engine's row says it serves."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import durably
from durably import Engine, InMemoryStateStore, WorkflowCtx
from durably._core.worker_beats import WorkerBeat
from durably._engine.worker.beats import WorkerBeats
from tests.engine_support import wait_until


class FlakyBeats(InMemoryStateStore):
    """The reference store whose heartbeat write fails while `down` is set (a store outage
    seen by the beat alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.failed = 0

    async def beat_worker(self, beat: WorkerBeat) -> None:
        if self.down:
            self.failed += 1
            raise ConnectionError("store unreachable")
        await super().beat_worker(beat)


def served() -> tuple[list[tuple[str, str]], list[str]]:
    return [("b.wf", "2"), ("a.wf", "1"), ("a.wf", "1")], ["s2", "s1"]


async def test_the_row_is_written_at_open_refreshed_and_removed_at_close() -> None:
    store = InMemoryStateStore()
    beats = WorkerBeats(store, instance_id="w1", namespace="acme", served=served, interval_ms=20)
    await beats.open()
    [first] = await store.list_worker_beats("acme", 0, 10)
    assert first.workflows == (("a.wf", "1"), ("b.wf", "2"))  # distinct, sorted
    assert first.steps == ("s1", "s2")
    assert first.tokens is None  # no transport to report on

    async def refreshed() -> bool:
        rows = await store.list_worker_beats("acme", 0, 10)
        return bool(rows) and rows[0].beat_at > first.beat_at

    await wait_until(refreshed, timeout=5)
    await beats.close()
    assert await store.list_worker_beats(None, 0, 10) == []


async def test_a_failing_beat_is_logged_once_per_streak(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="durably")
    store = FlakyBeats()
    beats = WorkerBeats(store, instance_id="w1", namespace=None, served=served, interval_ms=10)
    await beats.open()
    store.down = True

    async def failed_often() -> bool:
        return store.failed >= 5

    await wait_until(failed_often, timeout=5)
    store.down = False

    async def back() -> bool:
        return any("written again" in r.getMessage() for r in caplog.records)

    await wait_until(back, timeout=5)
    await beats.close()
    warnings = [r for r in caplog.records if "could not write the worker beat" in r.getMessage()]
    assert len(warnings) == 1
    assert (await store.list_worker_beats(None, 0, 10)) == []  # namespace None: '' row gone


async def test_an_engine_row_says_what_it_serves(uid: str) -> None:
    @durably.step(f"{uid}.s")
    async def s(x: int) -> int:
        return x

    @durably.workflow(f"{uid}.wf", version="3")
    async def wf(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(s, x)

    store = InMemoryStateStore()
    async with Engine(store=store, workflows=[wf], steps=[s], instance_id=f"{uid}-w") as engine:
        [row] = await store.list_worker_beats("default", 0, 10)
        assert row.instance_id == engine.instance_id
        assert row.workflows == ((f"{uid}.wf", "3"),)
        assert row.steps == (f"{uid}.s",)
    async with Engine(store=store, workflows=[wf], drive=False):
        assert await store.list_worker_beats(None, 0, 10) == []  # drives nothing: no row
