"""Huge paging values are clamped, not passed to SQL (found by the store-path property test:
an offset of 9.2e18 floored to 2^63 overflowed SQLite's INTEGER)."""

from __future__ import annotations

from pathlib import Path

from durably import StepCheckpoint, WorkflowRun
from durably._core.aggregates import MAX_PAGE_BOUND, CheckpointQuery, page_bounds
from durably._read.models import FanPageQuery
from durably._read.store_path import page_fan_from_store
from durably._read.summarize import fan_page_bounds
from durably._store.sql import SqlStateStore

from .builders import T0


def test_bounds_are_clamped() -> None:
    offset, _ = fan_page_bounds(FanPageQuery(offset=9.223372036854776e18))
    assert offset == MAX_PAGE_BOUND
    assert page_bounds(CheckpointQuery(offset=2**70, limit=2**70)) == (
        MAX_PAGE_BOUND,
        MAX_PAGE_BOUND,
    )


async def test_a_huge_offset_is_an_empty_page_on_sqlite(tmp_path: Path) -> None:
    store = SqlStateStore.from_url(f"sqlite:///{tmp_path / 'b.db'}")
    await store.ensure_schema()
    try:
        await store.create_run(
            WorkflowRun(
                id="r",
                workflow="w",
                workflow_version="1",
                status="running",
                created_at=T0,
                updated_at=T0,
            )
        )
        await store.save_checkpoint(
            StepCheckpoint(
                run_id="r",
                seq=0,
                name="s",
                kind="remote",
                step_id="r:0",
                status="completed",
                parallel_group="all:0:1",
                started_at=T0,
                finished_at=T0,
            )
        )
        page = await page_fan_from_store(
            store, "r", "all:0:1", FanPageQuery(offset=9.223372036854776e18)
        )
        assert page.items == () and page.total == 1
    finally:
        await store.close()
