"""Fans at scale: bulk member writes, batched
completion delivery, the join barrier, and folded `fan:` records — on every store/mode."""

from __future__ import annotations

import collections
from typing import Any

import durably
from durably import FatalError, Rejected, WorkflowCtx
from tests.engine_support import RESULT_TIMEOUT, EngineFactory


def _count_calls(store: Any) -> collections.Counter[str]:
    """Count calls per store method (wraps the methods of this store object)."""
    calls: collections.Counter[str] = collections.Counter()
    for name in dir(type(store)):
        method = getattr(store, name, None)
        if name.startswith("_") or not callable(method):
            continue

        def wrap(method: Any = method, name: str = name) -> Any:
            async def counted(*args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                return await method(*args, **kwargs)

            return counted

        if getattr(method, "__code__", None) is not None and method.__code__.co_flags & 0x80:
            setattr(store, name, wrap())
    return calls


async def test_a_child_fan_writes_its_members_in_bulk(engine_factory: EngineFactory, uid: str):
    """Starting N children is O(N / chunk) statements on the parent side: no per-member
    waiter, placeholder, lookup or insert; and the parent body runs a bounded number of
    turns (one per settled wave at most, thanks to the join barrier), not one per child."""
    turns = collections.Counter[str]()

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx, n: int) -> int:
        turns["body"] += 1
        return sum(await ctx.all(child, range(n)))

    n = 1500
    # reconcile_ms: no safety-net wakes during the test, so every replay counted below was
    # caused by the fan itself (the join barrier opening)
    async with engine_factory(fold_fans_over=10**9, reconcile_ms=600_000) as engine:
        calls = _count_calls(engine.store)
        result = await engine.execute(parent, n, run_id=f"{uid}-p", timeout=60)
        cps = await engine.list_checkpoints(f"{uid}-p")
    assert result == n * (n + 1) // 2
    assert len(cps) == n and all(cp.status == "completed" for cp in cps)
    assert calls["put_signal_waiter"] == 0
    assert calls["create_run"] == 1  # the parent itself
    # never a read per member: a few for the parent's turns and its handle
    assert calls["get_run"] <= (5 if not engine_factory.replay else 15)
    # one call per 1,000 members per launch; a replayed parent (replay mode) re-registers the
    # members still outstanding on each of its few turns
    bound = 3 if not engine_factory.replay else 10
    assert 1 <= calls["register_child_waits"] <= bound
    assert 1 <= calls["create_runs"] <= bound
    # every completion went through a batched delivery (how many share one batch depends on
    # how they arrive: under load they trickle in; on a quiet machine ~100 per batch)
    assert 1 <= calls["deliver_signals"] <= n
    # hot: one body run; replay: launch + at most a few barrier-opened wakes
    assert turns["body"] <= (1 if not engine_factory.replay else 6), turns


async def test_wide_fans_fold_settled_waves(engine_factory: EngineFactory, uid: str):
    """A fan at least `fold_fans_over` wide replaces each settled, fully
    successful wave by ONE `fan:` row; replays read it back; a wave with a failure keeps
    its member rows."""

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        if x == 7:
            raise FatalError("seven", code="SEVEN")
        return x * 10

    @durably.step(f"{uid}.after")
    def after(values: list[Any]) -> int:
        return len(values)

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        settled = await ctx.all_settled(child, range(9), concurrency=3)
        count = await ctx.step(after, [s.to_json() for s in settled])
        return [s.to_json() for s in settled], count

    async with engine_factory(fold_fans_over=5) as engine:
        result = await engine.execute(parent, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(f"{uid}-p")
        kids = [await engine.get_run(f"{uid}-p.all.0.w{i // 3}.{i}") for i in range(9)]
    values, count = result
    assert count == 9
    assert values[:7] == [{"status": "fulfilled", "value": i * 10} for i in range(7)]
    assert values[7] == {
        "status": "rejected",
        "id": f"{uid}-p.all.0.w2.7",
        "error": "seven",
        "code": "SEVEN",
    }
    assert values[8] == {"status": "fulfilled", "value": 80}
    assert [(cp.seq, cp.name) for cp in cps] == [
        (0, f"fan:{uid}-p.all.0.w0"),
        (3, f"fan:{uid}-p.all.0.w1"),
        (6, f"signal:child:{uid}-p.all.0.w2.6"),  # wave 2 has a failure: not folded
        (7, f"signal:child:{uid}-p.all.0.w2.7"),
        (8, f"signal:child:{uid}-p.all.0.w2.8"),
        (9, f"{uid}.after"),
    ]
    folded = cps[1]
    assert folded.kind == "signal" and folded.status == "completed"
    assert folded.parallel_group == "all:0:9"
    assert folded.output == {
        "first": 3,
        "count": 3,
        "completions": [{"ok": True, "value": v} for v in (30, 40, 50)],
    }
    assert all(k is not None and k.workflow == f"{uid}.child" for k in kids)


async def test_a_folded_fan_still_cascades_delete_to_its_children(
    engine_factory: EngineFactory, uid: str
):
    """Readers understand `fan:` rows: deleting the parent deletes the
    children a folded row covers."""

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> list[int]:
        return await ctx.all(child, range(4))

    async with engine_factory(fold_fans_over=2) as engine:
        assert await engine.execute(parent, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT) == [
            0,
            1,
            2,
            3,
        ]
        cps = await engine.list_checkpoints(f"{uid}-p")
        assert [cp.name for cp in cps] == [f"fan:{uid}-p.all.0"]
        assert await engine.delete_run(f"{uid}-p") == 5
        for i in range(4):
            assert await engine.get_run(f"{uid}-p.all.0.{i}") is None


async def test_failed_member_wakes_a_fail_fast_parent_through_the_barrier(
    engine_factory: EngineFactory, uid: str
):
    """A failed completion always opens the join barrier: fail_fast surfaces it
    while siblings are still running; closing the engine then leaves nothing behind."""
    import asyncio

    release = asyncio.Event()

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        if x == 0:
            raise FatalError("first", code="F")
        await ctx.sleep(60_000)  # the others stay running
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        try:
            await ctx.all(child, range(5), mode="fail_fast")
        except durably.GatherError as exc:
            release.set()
            return [f.code for f in exc.failures]
        return None

    async with engine_factory() as engine:
        assert await engine.execute(parent, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT) == ["F"]
        assert release.is_set()
        store = engine.store
    # Closing while the cancelled siblings still announce themselves to the parent (mailbox
    # deliveries) leaves no delivery running against the closed store: it would reopen the
    # store's connection and never close it.
    assert [task for task in asyncio.all_tasks() if task is not asyncio.current_task()] == []
    await asyncio.sleep(0.2)  # anything still running would have reached the store by now
    connector = getattr(store, "_cx", None)
    if connector is not None and hasattr(connector, "_writer_session"):
        assert connector._writer_session is None  # closed, and not reopened behind our back
        assert connector._task is None


def test_rejected_is_exported() -> None:
    assert Rejected("a", "b").to_json() == {"status": "rejected", "id": "a", "error": "b"}
