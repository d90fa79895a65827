"""`cancel_where(**query)`: the operator's bulk cancel, on Engine and Client alike, over a
real SQLite file: it cancels the live runs a `list_runs` query matches, bounded, and
returns their ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import durably
from durably import WorkflowCtx
from tests.engine_support import FAST_TUNING, wait_status


@durably.workflow("cw.waiter")
async def waiter(ctx: WorkflowCtx, n: int) -> Any:
    return await ctx.wait_for_signal(f"cw:{ctx.run_id}")


@durably.workflow("cw.quick")
async def quick(ctx: WorkflowCtx, n: int) -> int:
    return n


async def test_cancel_where_cancels_the_live_matches_and_returns_their_ids(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'cw.db'}"
    async with durably.Engine(url, workflows=[waiter, quick], **FAST_TUNING) as engine:
        for i in range(4):
            await engine.start(waiter, i, run_id=f"w{i}", tags=["batch-a" if i < 3 else "b"])
        done = await engine.start(quick, 1, run_id="q1", tags=["batch-a"])
        await done.result(timeout=20)
        for i in range(4):
            await wait_status(engine, f"w{i}", "suspended")

        first = await engine.cancel_where(tags=["batch-a"], limit=2)
        assert len(first) == 2 and set(first) <= {"w0", "w1", "w2"}
        async with durably.Client(url) as client:
            rest = await client.cancel_where(tags=["batch-a"])
        assert sorted(first + rest) == ["w0", "w1", "w2"]  # the completed q1 is left alone
        for run_id in ("w0", "w1", "w2"):
            await wait_status(engine, run_id, "cancelled")
        untouched = await engine.get_run("w3")
        assert untouched is not None and untouched.status == "suspended"
        quick_run = await engine.get_run("q1")
        assert quick_run is not None and quick_run.status == "completed"
        assert await engine.cancel_where(tags=["batch-a"]) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "without a filter would cancel every run"),
        ({"status": "suspended", "limit": 0}, "limit"),
        ({"status": "suspended", "offset": 3}, "no offset"),
    ],
)
async def test_cancel_where_refuses_an_unbounded_or_unfiltered_call(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    async with durably.Engine(f"sqlite:///{tmp_path / 'cw.db'}", workflows=[waiter]) as engine:
        with pytest.raises(ValueError, match=message):
            await engine.cancel_where(**kwargs)
