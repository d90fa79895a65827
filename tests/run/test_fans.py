"""Fans: ctx.all / ctx.all_settled over workflows and steps."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

import durably
from durably import (
    FatalError,
    Fulfilled,
    GatherError,
    Rejected,
    RunFailedError,
    Settled,
    WorkflowCtx,
)
from tests.engine_support import RESULT_TIMEOUT, EngineFactory, bump, wait_status


def _failures(exc: GatherError) -> list[dict[str, Any]]:
    return [
        {"index": f.index, "id": f.id, "error": f.error, "code": f.code, "details": f.details}
        for f in exc.failures
    ]


async def test_step_fan_outputs_in_input_order(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}
    attempts: dict[int, int] = {}

    @durably.step(f"{uid}.pre")
    def pre(x: int) -> int:
        return x

    @durably.step(f"{uid}.sq")
    async def sq(x: int) -> int:
        bump(counts, f"sq{x}")
        attempts[x] = attempts.get(x, 0) + 1
        if x == 2 and attempts[x] == 1:
            raise RuntimeError("flaky once")  # durable retry inside the fan
        await asyncio.sleep(0.01 * (5 - x))  # later inputs finish first
        return x * x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[int]:
        await ctx.step(pre, 0)
        out: list[int] = await ctx.all(sq, [1, 2, 3, 4], retries=2)
        return out

    async with engine_factory() as engine:
        handle = await engine.start(wf, run_id=f"{uid}-p")
        assert await handle.result(timeout=RESULT_TIMEOUT) == [1, 4, 9, 16]
        cps = await engine.list_checkpoints(handle.run_id)

    assert counts == {"sq1": 1, "sq2": 2, "sq3": 1, "sq4": 1}
    members = [cp for cp in cps if cp.seq >= 1]
    assert [(cp.seq, cp.name, cp.status) for cp in members] == [
        (s, f"{uid}.sq", "completed") for s in (1, 2, 3, 4)
    ]
    assert {cp.parallel_group for cp in members} == {"all:1:4"}
    assert [cp.step_id for cp in members] == [f"{uid}-p:{s}" for s in (1, 2, 3, 4)]
    assert cps[0].parallel_group is None


async def test_workflow_fan_outputs_in_input_order(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.work")
    async def work(x: int) -> int:
        bump(counts, f"work{x}")
        await asyncio.sleep(0.01 * (4 - x))
        return x * 10

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(work, x)

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> list[int]:
        await ctx.side_effect(lambda: 1)
        return await ctx.all(child, [1, 2, 3])

    async with engine_factory() as engine:
        handle = await engine.start(parent, run_id=f"{uid}-p")
        assert await handle.result(timeout=RESULT_TIMEOUT) == [10, 20, 30]
        cps = await engine.list_checkpoints(handle.run_id)
        kids = [await engine.get_run(f"{uid}-p.all.1.{i}") for i in range(3)]
        children = await engine.get_run_children(handle.run_id)

    assert counts == {"work1": 1, "work2": 1, "work3": 1}
    members = cps[1:]
    assert [(cp.seq, cp.name, cp.kind, cp.status) for cp in members] == [
        (1 + i, f"signal:child:{uid}-p.all.1.{i}", "signal", "completed") for i in range(3)
    ]
    assert {cp.parallel_group for cp in members} == {"all:1:3"}
    assert [cp.output for cp in members] == [{"ok": True, "value": v} for v in (10, 20, 30)]
    assert [k.status if k else None for k in kids] == ["completed"] * 3
    assert [k.input if k else None for k in kids] == [1, 2, 3]
    assert sorted(children) == [f"{uid}-p.all.1.{i}" for i in range(3)]


async def test_empty_and_one_item_fans(engine_factory: EngineFactory, uid: str):
    @durably.step(f"{uid}.inc")
    def inc(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x * 2

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        a = await ctx.all(child, [])
        b = await ctx.all_settled(inc, [])
        c = await ctx.all(child, [5])
        d = await ctx.all(inc, [7])
        return [a, b, c, d]

    async with engine_factory() as engine:
        handle = await engine.start(parent, run_id=f"{uid}-p")
        assert await handle.result(timeout=RESULT_TIMEOUT) == [[], [], [10], [8]]
        cps = await engine.list_checkpoints(handle.run_id)

    assert [(cp.seq, cp.name, cp.parallel_group) for cp in cps] == [
        (0, f"signal:child:{uid}-p.all.0.0", "all:0:1"),
        (1, f"{uid}.inc", "all:1:1"),
    ]


async def test_wait_all_gather_error_lists_every_failure(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        if x % 2:
            raise FatalError(f"odd {x}", code="ODD", details={"x": x})
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        try:
            await ctx.all(child, [0, 1, 2, 3])
        except GatherError as exc:
            return {"msg": str(exc), "total": exc.total, "failures": _failures(exc)}
        return None

    async with engine_factory() as engine:
        out = await engine.execute(parent, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)
        kids = [await engine.get_run(f"{uid}-p.all.0.{i}") for i in range(4)]

    ids = [f"{uid}-p.all.0.{i}" for i in range(4)]
    assert out == {
        "msg": f"ctx.all: 2 of 4 child(ren) failed: {ids[1]}, {ids[3]}",
        "total": 4,
        "failures": [
            {"index": 1, "id": ids[1], "error": "odd 1", "code": "ODD", "details": {"x": 1}},
            {"index": 3, "id": ids[3], "error": "odd 3", "code": "ODD", "details": {"x": 3}},
        ],
    }
    # wait_all never cancels siblings
    assert [k.status if k else None for k in kids] == [
        "completed",
        "failed",
        "completed",
        "failed",
    ]


async def test_fail_fast_workflow_fan_cancels_siblings(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.after")
    def after(x: int) -> int:
        bump(counts, "after")
        return x

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        if x == 2:
            raise FatalError("boom", code="BOOM", details={"x": x})
        await ctx.wait_for_signal(f"{uid}.never.{x}")
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        return await ctx.all(child, [0, 1, 2], mode="fail_fast")

    @durably.workflow(f"{uid}.catcher")
    async def catcher(ctx: WorkflowCtx) -> Any:
        try:
            await ctx.all(child, [0, 1, 2], mode="fail_fast")
        except GatherError as exc:
            # the body goes on: a replay (replay mode) must observe the same first failure
            # although the cancelled siblings have completed by then
            await ctx.step(after, 1)
            return _failures(exc)
        return None

    async with engine_factory() as engine:
        handle = await engine.start(parent, run_id=f"{uid}-p")
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        for i in (0, 1):
            await wait_status(engine, f"{uid}-p.all.0.{i}", "cancelled")
        failed = await engine.get_run(f"{uid}-p.all.0.2")
        caught = await engine.execute(catcher, run_id=f"{uid}-c", timeout=RESULT_TIMEOUT)
        for i in (0, 1):
            await wait_status(engine, f"{uid}-c.all.0.{i}", "cancelled")
        cps = await engine.list_checkpoints(f"{uid}-c")

    assert info.value.error is not None
    assert info.value.error.message == f"ctx.all: 1 of 3 child(ren) failed: {uid}-p.all.0.2"
    assert failed is not None and failed.status == "failed"
    assert caught == [
        {"index": 2, "id": f"{uid}-c.all.0.2", "error": "boom", "code": "BOOM", "details": {"x": 2}}
    ]
    assert counts == {"after": 1}
    assert [(cp.seq, cp.status, cp.parallel_group) for cp in cps] == [
        (0, "running", "all:0:3:ff"),
        (1, "running", "all:0:3:ff"),
        (2, "completed", "all:0:3:ff"),
        (3, "completed", None),
    ]


async def test_fail_fast_step_fan_raises_first_failure(engine_factory: EngineFactory, uid: str):
    @durably.step(f"{uid}.check")
    async def check(x: int) -> int:
        if x == 1:
            raise FatalError("bad input", code="BAD", details={"x": x})
        await asyncio.sleep(0.02)
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        try:
            await ctx.all(check, [0, 1, 2], mode="fail_fast")
        except GatherError as exc:
            return {"total": exc.total, "failures": _failures(exc)}
        return None

    @durably.workflow(f"{uid}.all")
    async def wait_all(ctx: WorkflowCtx) -> Any:
        try:
            await ctx.all(check, [1, 0, 1])
        except GatherError as exc:
            return [f["index"] for f in _failures(exc)]
        return None

    async with engine_factory() as engine:
        out = await engine.execute(wf, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)
        every = await engine.execute(wait_all, timeout=RESULT_TIMEOUT)

    assert every == [0, 2]

    assert out == {
        "total": 3,
        "failures": [
            {
                "index": 1,
                "id": f"{uid}-p:1",
                "error": "bad input",
                "code": "BAD",
                "details": {"x": 1},
            },
        ],
    }


async def test_all_settled_workflow_and_step_fans(engine_factory: EngineFactory, uid: str):
    @durably.step(f"{uid}.half")
    def half(x: int) -> int:
        if x % 2:
            raise FatalError("odd", code="ODD", details={"x": x})
        return x // 2

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        if x == 1:
            raise FatalError("no one", code="ONE", details=[1])
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        kids: list[Settled[int]] = await ctx.all_settled(child, [0, 1])
        steps = await ctx.all_settled(half, [2, 3], retries=3)
        return {
            "kids": [s.to_json() for s in kids],
            "steps": [s.to_json() for s in steps],
            "status": [s.status for s in kids + steps],
            "types": [type(s).__name__ for s in kids + steps],
        }

    async with engine_factory() as engine:
        out = await engine.execute(parent, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)

    assert out == {
        "kids": [
            {"status": "fulfilled", "value": 0},
            {
                "status": "rejected",
                "id": f"{uid}-p.all.0.1",
                "error": "no one",
                "code": "ONE",
                "details": [1],
            },
        ],
        "steps": [
            {"status": "fulfilled", "value": 1},
            {
                "status": "rejected",
                "id": f"{uid}-p:3",
                "error": "odd",
                "code": "ODD",
                "details": {"x": 3},
            },
        ],
        "status": ["fulfilled", "rejected", "fulfilled", "rejected"],
        "types": ["Fulfilled", "Rejected", "Fulfilled", "Rejected"],
    }
    assert Rejected("a", "e").to_json() == {"status": "rejected", "id": "a", "error": "e"}
    assert Settled.from_json(Fulfilled(3).to_json()) == Fulfilled(3)


async def test_waves_with_concurrency(engine_factory: EngineFactory, uid: str):
    log: list[tuple[str, int]] = []
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.rec")
    async def rec(x: int) -> int:
        bump(counts, f"rec{x}")
        log.append(("start", x))
        await asyncio.sleep(0.01 * (x % 2))
        log.append(("end", x))
        return x

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(rec, x)

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        kids = await ctx.all(child, [0, 1, 2, 3, 4], concurrency=2)
        steps = await ctx.all(rec, [10, 11, 12], concurrency=2)
        return [kids, steps]

    async with engine_factory() as engine:
        handle = await engine.start(parent, run_id=f"{uid}-p")
        assert await handle.result(timeout=RESULT_TIMEOUT) == [[0, 1, 2, 3, 4], [10, 11, 12]]
        cps = await engine.list_checkpoints(handle.run_id)

    assert counts == {f"rec{x}": 1 for x in (0, 1, 2, 3, 4, 10, 11, 12)}
    assert [cp.name for cp in cps[:5]] == [
        f"signal:child:{uid}-p.all.0.w{i // 2}.{i}" for i in range(5)
    ]
    assert {cp.parallel_group for cp in cps[:5]} == {"all:0:5"}
    assert {cp.parallel_group for cp in cps[5:]} == {"all:5:3"}
    # wave k+1 starts only after every member of wave k ended
    waves = [[0, 1], [2, 3], [4], [10, 11], [12]]
    for earlier, later in itertools.pairwise(waves):
        last_end = max(log.index(("end", x)) for x in earlier)
        first_start = min(log.index(("start", x)) for x in later)
        assert last_end < first_start, log
