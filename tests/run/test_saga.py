"""Compensation (sagas): the undo stack, the failure-path unwind.

and cancel(compensate=True) with the `cancelling` status.
"""

from __future__ import annotations

from typing import Any

import pytest

import durably
from durably import RunFailedError, WorkflowCtx
from tests.engine_support import (
    RESULT_TIMEOUT,
    EngineFactory,
    EventLog,
    bump,
    wait_status,
    wait_suspended,
    wait_until,
)


def _saga(uid: str, order: list[str], counts: dict[str, int], *, undo_fails: bool = False) -> Any:
    @durably.step(f"{uid}.reserve")
    async def reserve(x: int) -> int:
        return x * 10

    @durably.step(f"{uid}.unreserve", retries=2)
    async def unreserve(undo: dict[str, Any]) -> None:
        bump(counts, "unreserve")
        order.append(f"unreserve:{undo['input']}:{undo['output']}")
        if undo_fails:
            raise RuntimeError("cannot unreserve")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        def undo_a() -> None:
            bump(counts, "undo_a")
            order.append("undo_a")

        async def undo_c() -> None:
            bump(counts, "undo_c")
            order.append("undo_c")

        def boom(log: Any) -> int:
            raise durably.FatalError("boom", code="declined")

        await ctx.local_step("a", lambda log: 1, compensate=undo_a)
        await ctx.step(reserve, x, compensate=unreserve)
        await ctx.local_step("c", lambda log: 3, compensate=undo_c)
        await ctx.local_step("plain", lambda log: 4)
        await ctx.local_step("boom", boom)
        return 0

    return wf


async def test_undos_run_in_reverse_order_and_the_run_fails_with_the_original_error(
    engine_factory: EngineFactory, uid: str
) -> None:
    order: list[str] = []
    counts: dict[str, int] = {}
    wf = _saga(uid, order, counts)
    async with engine_factory() as engine:
        events = EventLog(engine)
        handle = await engine.start(wf, 7)
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        run = await engine.get_run(handle.run_id)
        cps = await engine.list_checkpoints(handle.run_id)

    assert order == ["undo_c", "unreserve:7:70", "undo_a"]
    assert counts == {"undo_c": 1, "unreserve": 1, "undo_a": 1}
    assert "boom" in str(info.value)
    assert run is not None and run.status == "failed"
    assert run.error is not None and run.error.message == "boom" and run.error.code == "declined"
    undo_rows = sorted((cp for cp in cps if cp.seq < 0), key=lambda cp: cp.seq, reverse=True)
    assert [(cp.seq, cp.name, cp.kind, cp.status) for cp in undo_rows] == [
        (-1, "compensate:c", "local", "completed"),
        (-2, f"compensate:{uid}.reserve", "remote", "completed"),
        (-3, "compensate:a", "local", "completed"),
    ]
    assert undo_rows[1].input == {"input": 7, "output": 70}
    completed = [e.name for e in events.of(handle.run_id, "step.completed")]
    assert completed[-3:] == ["compensate:c", f"compensate:{uid}.reserve", "compensate:a"]


async def test_an_exhausted_undo_is_reported_and_skipped(
    engine_factory: EngineFactory, uid: str
) -> None:
    order: list[str] = []
    counts: dict[str, int] = {}
    wf = _saga(uid, order, counts, undo_fails=True)
    async with engine_factory() as engine:
        events = EventLog(engine)
        handle = await engine.start(wf, 2)
        with pytest.raises(RunFailedError):
            await handle.result(timeout=RESULT_TIMEOUT)
        run = await engine.get_run(handle.run_id)
        cps = {cp.seq: cp for cp in await engine.list_checkpoints(handle.run_id)}

    # the undo step's own decorator policy: retries=2 → two attempts, then skipped
    assert counts == {"undo_c": 1, "unreserve": 2, "undo_a": 1}
    assert order == ["undo_c", "unreserve:2:20", "unreserve:2:20", "undo_a"]
    assert cps[-2].status == "failed" and cps[-2].attempts == 2
    failed = [e.name for e in events.of(handle.run_id, "step.failed")]
    assert f"compensate:{uid}.reserve" in failed
    assert run is not None and run.error is not None and run.error.message == "boom"


async def test_a_failing_local_undo_is_tried_compensation_retries_times(
    engine_factory: EngineFactory, uid: str
) -> None:
    counts: dict[str, int] = {}

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        def undo() -> None:
            bump(counts, "undo")
            raise RuntimeError("undo broke")

        def boom(log: Any) -> int:
            raise durably.FatalError("boom")

        await ctx.local_step("a", lambda log: 1, compensate=undo)
        await ctx.local_step("boom", boom)
        return 0

    async with engine_factory(compensation_retries=3) as engine:
        handle = await engine.start(wf, 1)
        with pytest.raises(RunFailedError):
            await handle.result(timeout=RESULT_TIMEOUT)
        cps = {cp.seq: cp for cp in await engine.list_checkpoints(handle.run_id)}

    assert counts == {"undo": 3}
    assert cps[-1].name == "compensate:a" and cps[-1].status == "failed"
    assert cps[-1].attempts == 3


async def test_undos_never_run_on_success(engine_factory: EngineFactory, uid: str) -> None:
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.undo")
    async def undo_step(undo: dict[str, Any]) -> None:
        bump(counts, "step")

    @durably.step(f"{uid}.do")
    async def do(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        a = await ctx.local_step("a", lambda log: x, compensate=lambda: bump(counts, "local"))
        b = await ctx.step(do, a, compensate=f"{uid}.undo")
        await ctx.sleep(0.01)
        return b

    async with engine_factory() as engine:
        assert await engine.execute(wf, 1, timeout=RESULT_TIMEOUT) == 2

    assert counts == {}


async def test_a_replayed_failed_run_is_not_compensated_twice(
    engine_factory: EngineFactory, uid: str
) -> None:
    order: list[str] = []
    counts: dict[str, int] = {}
    wf = _saga(uid, order, counts)
    async with engine_factory() as engine:
        handle = await engine.start(wf, 3)
        with pytest.raises(RunFailedError):
            await handle.result(timeout=RESULT_TIMEOUT)
        # A crash after the unwind but before the settle: the run reads `running` again.
        await engine.store.update_run(handle.run_id, {"status": "running", "error": None})
        await engine.resume(handle.run_id)

        async def failed_again() -> bool:
            run = await engine.get_run(handle.run_id)
            return run is not None and run.status == "failed"

        await wait_until(failed_again)
        run = await engine.get_run(handle.run_id)

    assert counts == {"undo_c": 1, "unreserve": 1, "undo_a": 1}
    assert run is not None and run.error is not None and run.error.message == "boom"


async def test_compensating_cancel_undoes_completed_steps_and_ends_cancelled(
    engine_factory: EngineFactory, uid: str
) -> None:
    order: list[str] = []

    @durably.step(f"{uid}.do")
    async def do(x: int) -> int:
        return x + 1

    @durably.step(f"{uid}.undo")
    async def undo_step(undo: dict[str, Any]) -> None:
        order.append(f"undo_step:{undo['output']}")

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        await ctx.local_step("c1", lambda log: x, compensate=lambda: order.append("child_undo"))
        await ctx.sleep(60)
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        await ctx.local_step("a", lambda log: x, compensate=lambda: order.append("undo_a"))
        await ctx.step(do, x, compensate=undo_step)
        await ctx.start_child(child, x, id=f"{ctx.run_id}-child")
        await ctx.sleep(60)
        return x

    async with engine_factory() as engine:
        events = EventLog(engine)
        handle = await engine.start(wf, 1)
        await wait_suspended(engine, handle.run_id)
        await wait_suspended(engine, f"{handle.run_id}-child")
        result = await engine.cancel(handle.run_id, compensate=True)
        assert result is not None and result.status in ("cancelling", "cancelled")
        again = await engine.cancel(handle.run_id, compensate=True)
        assert again is not None and again.status in ("cancelling", "cancelled")
        run = await wait_status(engine, handle.run_id, "cancelled")
        kid = await wait_status(engine, f"{handle.run_id}-child", "cancelled")
        failed = events.of(handle.run_id, "run.failed")

    assert order.index("undo_step:2") < order.index("undo_a")
    assert sorted(order) == sorted(["undo_step:2", "undo_a", "child_undo"])
    assert run.error is not None and run.error.message == "cancelled"
    assert kid.error is not None and kid.error.message == "cancelled"
    assert len(failed) == 1


async def test_recovery_redrives_a_crashed_cancelling_run(
    engine_factory: EngineFactory, uid: str
) -> None:
    counts: dict[str, int] = {}

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        await ctx.local_step("a", lambda log: x, compensate=lambda: bump(counts, "undo_a"))
        await ctx.sleep(60)
        return x

    async with engine_factory() as engine:
        handle = await engine.start(wf, 1)
        await wait_suspended(engine, handle.run_id)
    # A process wrote `cancelling` and crashed before its turn ran: the next turn re-derives the
    # compensating cancel from the status.
    async with engine_factory() as engine:
        await engine.store.update_run(
            handle.run_id, {"status": "cancelling", "locked_by": None, "locked_until": None}
        )
        await engine.recover_incomplete()
        run = await wait_status(engine, handle.run_id, "cancelled")

    assert counts == {"undo_a": 1}
    assert run.error is not None and run.error.message == "cancelled"
