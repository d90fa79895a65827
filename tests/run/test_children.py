"""Child workflows: ctx.child, ctx.start_child, failures, cancel cascade."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durably
from durably import FatalError, RunFailedError, WorkflowCtx
from tests.engine_support import (
    RESULT_TIMEOUT,
    EngineFactory,
    bump,
    shape,
    wait_status,
    wait_waiting_on,
)


async def test_child_output(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.sq")
    def sq(x: int) -> int:
        bump(counts, "sq")
        return x * x

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> dict[str, int]:
        return {"sq": await ctx.step(sq, x)}

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx, x: int) -> int:
        first = await ctx.child(child, x)
        second = await ctx.child(f"{uid}.child", x + 1)  # by name
        return first["sq"] + second["sq"]

    async with engine_factory() as engine:
        handle = await engine.start(parent, 3, run_id=f"{uid}-p")
        assert await handle.result(timeout=RESULT_TIMEOUT) == 9 + 16
        cps = await engine.list_checkpoints(handle.run_id)
        c0 = await engine.get_run(f"{uid}-p.child.0")
        c1 = await engine.get_run(f"{uid}-p.child.1")
        children = await engine.get_run_children(handle.run_id)

    assert counts["sq"] == 2
    assert shape(cps) == [
        (0, f"signal:child:{uid}-p.child.0", "signal", "completed"),
        (1, f"signal:child:{uid}-p.child.1", "signal", "completed"),
    ]
    assert cps[0].output == {"ok": True, "value": {"sq": 9}}
    assert c0 is not None and c0.status == "completed" and c0.input == 3
    assert c0.output == {"sq": 9} and c0.workflow == f"{uid}.child"
    assert c1 is not None and c1.status == "completed" and c1.input == 4
    assert sorted(children) == [f"{uid}-p.child.0", f"{uid}-p.child.1"]


async def test_failed_child_raises_fatal_error_in_parent(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        raise FatalError("child exploded", code="CHILD_BAD", details={"x": x})

    @durably.workflow(f"{uid}.catcher")
    async def catcher(ctx: WorkflowCtx) -> Any:
        try:
            await ctx.child(child, 1, id=f"{uid}-kid-1")
        except FatalError as exc:
            return {"msg": str(exc), "code": exc.code, "details": exc.details}
        return None

    @durably.workflow(f"{uid}.propagator")
    async def propagator(ctx: WorkflowCtx) -> Any:
        return await ctx.child(child, 2, id=f"{uid}-kid-2")

    async with engine_factory() as engine:
        out = await engine.execute(catcher, timeout=RESULT_TIMEOUT)
        handle = await engine.start(propagator)
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        kid = await engine.get_run(f"{uid}-kid-2")
        cps = await engine.list_checkpoints(handle.run_id)

    assert out == {
        "msg": f'child "{uid}-kid-1" failed: child exploded',
        "code": "CHILD_BAD",
        "details": {"x": 1},
    }
    assert info.value.error is not None
    assert info.value.error.code == "CHILD_BAD"
    assert info.value.error.details == {"x": 2}
    assert info.value.error.message == f'child "{uid}-kid-2" failed: child exploded'
    assert kid is not None and kid.status == "failed"
    assert shape(cps) == [(0, f"signal:child:{uid}-kid-2", "signal", "completed")]
    assert cps[0].output == {
        "ok": False,
        "error": "child exploded",
        "code": "CHILD_BAD",
        "details": {"x": 2},
    }


async def test_start_child_then_join_by_id(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.child-go"
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.work")
    def work(x: int) -> int:
        bump(counts, "work")
        return x + 100

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        got = await ctx.wait_for_signal(token)
        return x * 10 + got

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx, x: int) -> Any:
        cid = await ctx.start_child(child, x)
        mid = await ctx.step(work, x)
        joined = await ctx.child(child, x, id=cid)
        return {"cid": cid, "mid": mid, "joined": joined}

    async with engine_factory() as engine:
        handle = await engine.start(parent, 4, run_id=f"{uid}-p")
        cid = f"{uid}-p.child.0"
        await wait_waiting_on(engine, cid, token)
        await wait_status(engine, handle.run_id, "suspended")
        await engine.signal(token, 2)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)
        kid = await engine.get_run(cid)

    assert out == {"cid": cid, "mid": 104, "joined": 42}
    assert counts == {"work": 1}
    assert shape(cps) == [
        (0, f"spawn:{cid}", "local", "completed"),
        (1, f"{uid}.work", "remote", "completed"),
        (2, f"signal:child:{cid}", "signal", "completed"),
    ]
    assert cps[0].output == cid
    assert kid is not None and kid.status == "completed" and kid.output == 42


async def test_join_of_already_finished_spawned_child(engine_factory: EngineFactory, uid: str):
    """The child's completion is buffered on `child:<id>`; the later join consumes it."""

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        cid = await ctx.start_child(child, 1, id=f"{uid}-kid")
        await ctx.sleep("200ms")
        return await ctx.child(child, 1, id=cid)

    async with engine_factory() as engine:
        handle = await engine.start(parent)
        await wait_status(engine, f"{uid}-kid", "completed")
        assert await handle.result(timeout=RESULT_TIMEOUT) == 2
        cps = await engine.list_checkpoints(handle.run_id)

    assert shape(cps) == [
        (0, f"spawn:{uid}-kid", "local", "completed"),
        (1, "sleep", "sleep", "completed"),
        (2, f"signal:child:{uid}-kid", "signal", "completed"),
    ]


async def test_child_of_unregistered_workflow_fails_the_parent(
    engine_factory: EngineFactory, uid: str
):
    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        return await ctx.child(f"{uid}.ghost", 1)

    async with engine_factory() as engine:
        handle = await engine.start(parent, run_id=f"{uid}-p")
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        ghost = await engine.get_run(f"{uid}-p.child.0")

    assert info.value.error is not None
    assert info.value.error.message.startswith(
        f'child "{uid}-p.child.0" failed: child workflow "{uid}.ghost" failed to start:'
    )
    assert "not registered" in info.value.error.message
    assert ghost is None


async def test_cancel_run_and_cascade_to_child(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.never"

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(token)

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        return await ctx.child(child, None, id=f"{uid}-kid")

    async with engine_factory() as engine:
        events: list[Any] = []
        engine.subscribe(events.append)
        handle = await engine.start(parent, run_id=f"{uid}-p")
        await wait_waiting_on(engine, f"{uid}-kid", token)
        await wait_status(engine, handle.run_id, "suspended")

        result = await engine.cancel(handle.run_id)
        parent_row = await wait_status(engine, handle.run_id, "cancelled")
        kid_row = await wait_status(engine, f"{uid}-kid", "cancelled")
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        # A second cancel of a cancelled run changes nothing.
        again = await engine.cancel(handle.run_id)
        # A signal for the cancelled child does not resurrect it.
        await engine.signal(token, "late")
        kid_after = await engine.get_run(f"{uid}-kid")

    assert result is not None and result.status == "cancelled"
    assert info.value.status == "cancelled"
    assert parent_row.error is not None and parent_row.error.message == "cancelled"
    assert kid_row.error is not None and kid_row.error.message == "cancelled"
    assert again is not None and again.status == "cancelled"
    assert kid_after is not None and kid_after.status == "cancelled"
    failed = [e.run_id for e in events if e.type == "run.failed"]
    assert failed.count(handle.run_id) == 1
    assert failed.count(f"{uid}-kid") == 1


async def test_parent_awaiting_a_cancelled_child_fails(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.never"

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(token)

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        return await ctx.child(child, None, id=f"{uid}-kid")

    async with engine_factory() as engine:
        handle = await engine.start(parent)
        await wait_waiting_on(engine, f"{uid}-kid", token)
        await engine.cancel(f"{uid}-kid")
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert info.value.status == "failed"
    assert info.value.error is not None
    assert info.value.error.code == "cancelled"
    assert info.value.error.message == f'child "{uid}-kid" failed: cancelled'
    assert cps[0].output == {"ok": False, "error": "cancelled", "code": "cancelled"}


async def test_delete_run_cascades_to_children(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.leaf")
    async def leaf(ctx: WorkflowCtx, x: int) -> int:
        return x

    @durably.workflow(f"{uid}.mid")
    async def mid(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.child(leaf, x) + 1

    @durably.workflow(f"{uid}.root")
    async def root(ctx: WorkflowCtx) -> int:
        a = await ctx.child(mid, 1)
        spawned = await ctx.start_child(leaf, 5)
        b = await ctx.child(leaf, 5, id=spawned)
        return a + b

    async with engine_factory() as engine:
        handle = await engine.start(root, run_id=f"{uid}-r")
        assert await handle.result(timeout=RESULT_TIMEOUT) == 7
        ids = [
            f"{uid}-r",
            f"{uid}-r.child.0",
            f"{uid}-r.child.0.child.0",
            f"{uid}-r.child.1",
        ]
        before = [await engine.get_run(i) for i in ids]
        deleted = await engine.delete_run(f"{uid}-r")
        after = [await engine.get_run(i) for i in ids]
        cps_after = [await engine.list_checkpoints(i) for i in ids]
        again = await engine.delete_run(f"{uid}-r")

    assert all(r is not None and r.status == "completed" for r in before)
    assert deleted == 4
    assert after == [None, None, None, None]
    assert cps_after == [[], [], [], []]
    assert again == 0


async def test_requeue_of_parent_requeues_the_failed_child(engine_factory: EngineFactory, uid: str):
    state = {"fail": True}
    counts: dict[str, int] = {}

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        if state["fail"]:
            raise FatalError("not yet", code="LATER")
        return x + 1

    @durably.step(f"{uid}.before")
    def before(x: int) -> int:
        bump(counts, "before")
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> int:
        x = await ctx.step(before, 1)
        return await ctx.child(child, x, id=f"{uid}-kid")

    async with engine_factory() as engine:
        handle = await engine.start(parent)
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        state["fail"] = False
        await engine.retry(handle.run_id)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 2
        kid = await engine.get_run(f"{uid}-kid")
        cps = await engine.list_checkpoints(handle.run_id)

    assert info.value.error is not None and info.value.error.code == "LATER"
    assert kid is not None and kid.status == "completed" and kid.output == 2
    assert counts["before"] == 1
    assert shape(cps) == [
        (0, f"{uid}.before", "remote", "completed"),
        (1, f"signal:child:{uid}-kid", "signal", "completed"),
    ]
    assert cps[1].output == {"ok": True, "value": 2}


async def test_requeue_of_parent_takes_a_fixed_replays_success_instead_of_rerunning_the_child(
    engine_factory: EngineFactory, uid: str
):
    """The failed child was fixed and replayed as a new run while its parent stood failed:
    the replay's success waits buffered for the parent. Requeueing the parent looks at that
    buffer without taking from it, leaves the failed child alone, and the parent's join takes
    the success."""
    runs: list[int] = []

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        runs.append(x)
        if x < 0:
            raise FatalError("negative", code="NEG")
        return x * 10

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> int:
        return await ctx.child(child, -1, id=f"{uid}-kid")

    async with engine_factory() as engine:
        handle = await engine.start(parent)
        with pytest.raises(RunFailedError):
            await handle.result(timeout=RESULT_TIMEOUT)
        fixed = await engine.retry_with_input(f"{uid}-kid", 4)
        assert fixed is not None
        assert await engine.get_handle(fixed).result(timeout=RESULT_TIMEOUT) == 40
        async with asyncio.timeout(RESULT_TIMEOUT):  # the success is announced after it settles
            while not (  # noqa: ASYNC110 - polls the store, which has no event to await
                buffered := await engine.store.peek_buffered_signals(f"child:{uid}-kid", 10)
            ):
                await asyncio.sleep(0.01)
        assert [hit.payload for hit in buffered] == [{"ok": True, "value": 40}]
        await engine.retry(handle.run_id)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 40
        kid = await engine.get_run(f"{uid}-kid")
        assert await engine.store.peek_buffered_signals(f"child:{uid}-kid", 10) == []

    assert runs == [-1, 4]  # the failed child itself never ran again
    assert kid is not None and kid.status == "failed"


async def test_cancel_cascades_to_spawned_child(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(f"{uid}.child-never")

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        await ctx.start_child(child, None, id=f"{uid}-kid")
        return await ctx.wait_for_signal(f"{uid}.parent-never")

    async with engine_factory() as engine:
        handle = await engine.start(parent)
        await wait_waiting_on(engine, f"{uid}-kid", f"{uid}.child-never")
        await wait_waiting_on(engine, handle.run_id, f"{uid}.parent-never")
        await engine.cancel(handle.run_id)
        kid = await wait_status(engine, f"{uid}-kid", "cancelled")
        row = await engine.get_run(handle.run_id)

    assert row is not None and row.status == "cancelled"
    assert kid.error is not None and kid.error.message == "cancelled"
