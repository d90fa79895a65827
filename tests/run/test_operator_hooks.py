"""breakpoint, patched, continue_as_new, search attributes, updates and non-determinism."""

from __future__ import annotations

from typing import Any

import pytest

import durably
from durably import RunFailedError, Workflow, WorkflowCtx
from tests.engine_support import (
    RESULT_TIMEOUT,
    EngineFactory,
    bump,
    shape,
    wait_status,
    wait_suspended,
    wait_until,
    wait_waiting_on,
)


async def test_breakpoint_and_continue_run(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.work")
    def work(x: int) -> int:
        bump(counts, "work")
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        a = await ctx.step(work, x)
        await ctx.breakpoint("inspect")
        return await ctx.step(work, a)

    async with engine_factory() as engine:
        handle = await engine.start(wf, 1)
        await wait_suspended(engine, handle.run_id)
        paused = await engine.list_checkpoints(handle.run_id)
        result = await engine.continue_run(handle.run_id)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 3
        cps = await engine.list_checkpoints(handle.run_id)
        nothing = await engine.continue_run(handle.run_id)

    assert shape(paused) == [
        (0, f"{uid}.work", "remote", "completed"),
        (1, "breakpoint:inspect", "signal", "pending"),
    ]
    assert result is not None and result.run_id == handle.run_id
    assert counts == {"work": 2}
    assert shape(cps) == [
        (0, f"{uid}.work", "remote", "completed"),
        (1, f"signal:bp:{handle.run_id}:1", "signal", "completed"),
        (2, f"{uid}.work", "remote", "completed"),
    ]
    assert nothing is None  # no pending breakpoint left


def _old_and_new(uid: str, counts: dict[str, int]) -> tuple[Workflow[Any, Any], ...]:
    """Two bodies registered under the SAME name@version (a code change under a run)."""
    token = f"{uid}.go"

    @durably.step(f"{uid}.a")
    def a(x: int) -> int:
        bump(counts, "a")
        return x + 1

    @durably.step(f"{uid}.b")
    def b(x: int) -> int:
        bump(counts, "b")
        return x * 100

    async def old_body(ctx: WorkflowCtx, x: int) -> Any:
        y = await ctx.step(a, x)
        got = await ctx.wait_for_signal(token)
        return {"y": y, "got": got}

    async def patched_body(ctx: WorkflowCtx, x: int) -> Any:
        patched = await ctx.patched("use-b")
        y = await ctx.step(a, x)
        if patched:
            y = await ctx.step(b, y)
        got = await ctx.wait_for_signal(token)
        return {"y": y, "got": got, "patched": patched}

    async def renamed_body(ctx: WorkflowCtx, x: int) -> Any:
        y = await ctx.step(b, x)  # a different step at the recorded seq 0
        got = await ctx.wait_for_signal(token)
        return {"y": y, "got": got}

    name = f"{uid}.evolving"
    return (
        Workflow(old_body, name, "1"),
        Workflow(patched_body, name, "1"),
        Workflow(renamed_body, name, "1"),
    )


async def test_patched_new_run_takes_the_new_branch(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}
    _, new, _ = _old_and_new(uid, counts)

    async with engine_factory(workflows=[new]) as engine:
        handle = await engine.start(new, 1)
        await wait_waiting_on(engine, handle.run_id, f"{uid}.go")
        await engine.signal(f"{uid}.go", "sig")
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert out == {"y": 200, "got": "sig", "patched": True}
    assert counts == {"a": 1, "b": 1}
    assert shape(cps) == [
        (0, "patch:use-b", "local", "completed"),
        (1, f"{uid}.a", "remote", "completed"),
        (2, f"{uid}.b", "remote", "completed"),
        (3, f"signal:{uid}.go", "signal", "completed"),
    ]
    assert cps[0].output is True


async def test_patched_old_run_takes_the_old_branch(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}
    old, new, _ = _old_and_new(uid, counts)

    async with engine_factory(workflows=[old]) as engine:
        handle = await engine.start(old, 1)
        run_id = handle.run_id
        await wait_waiting_on(engine, run_id, f"{uid}.go")
    # Redeploy: a fresh engine on the same store with the patched body.
    async with engine_factory(workflows=[new]) as engine:
        await engine.signal(f"{uid}.go", "sig")
        out = await engine.get_handle(run_id).result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(run_id)

    assert out == {"y": 2, "got": "sig", "patched": False}
    assert counts == {"a": 1}  # step a was not re-executed, b never ran
    # No marker row, and the old run's recorded steps kept their seqs.
    assert shape(cps) == [
        (0, f"{uid}.a", "remote", "completed"),
        (1, f"signal:{uid}.go", "signal", "completed"),
    ]


async def test_non_determinism_fails_the_run(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}
    old, _, renamed = _old_and_new(uid, counts)

    async with engine_factory(workflows=[old]) as engine:
        handle = await engine.start(old, 1)
        run_id = handle.run_id
        await wait_waiting_on(engine, run_id, f"{uid}.go")
    async with engine_factory(workflows=[renamed]) as engine:
        await engine.signal(f"{uid}.go", "sig")
        with pytest.raises(RunFailedError) as info:
            await engine.get_handle(run_id).result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(run_id)

    error = info.value.error
    assert error is not None
    assert error.code == "non_determinism"
    assert f"non-determinism at {run_id}#0" in error.message
    assert f'expects "{uid}.b"' in error.message
    assert f'recorded "{uid}.a"' in error.message
    assert counts == {"a": 1}  # b never ran
    assert shape(cps) == [
        (0, f"{uid}.a", "remote", "completed"),
        (1, f"signal:{uid}.go", "signal", "completed"),
    ]


async def test_non_determinism_via_same_engine_registry(engine_factory: EngineFactory, uid: str):
    """Swap the body in the running engine's registry; the next replay detects the change.

    A resident run keeps its original coroutine, so only a run that replays (replay mode, or
    after eviction) sees the new body: the engine is closed (evicting the parked run) and
    reopened, reusing the registry object."""
    counts: dict[str, int] = {}
    old, _, renamed = _old_and_new(uid, counts)

    engine = engine_factory(workflows=[old])
    async with engine:
        handle = await engine.start(old, 1)
        await wait_waiting_on(engine, handle.run_id, f"{uid}.go")
        engine.register(renamed)  # same name@version: replaces the body
        assert engine.registration(old.name, "1") is renamed
    async with engine_factory(workflows=engine.registered_workflows()) as engine2:
        await engine2.signal(f"{uid}.go", "sig")
        with pytest.raises(RunFailedError) as info:
            await engine2.get_handle(handle.run_id).result(timeout=RESULT_TIMEOUT)

    assert info.value.error is not None and info.value.error.code == "non_determinism"


async def test_continue_as_new(engine_factory: EngineFactory, uid: str):
    seen: list[int] = []

    @durably.workflow(f"{uid}.loop")
    async def loop(ctx: WorkflowCtx, n: int) -> str:
        seen.append(n)
        await ctx.set_event("n", n)
        if n < 2:
            ctx.continue_as_new(n + 1)
        return f"finished at {n}"

    async with engine_factory() as engine:
        handle = await engine.start(loop, 0, run_id=f"{uid}-r")
        first = await engine.wait_for_run(handle.run_id, timeout=RESULT_TIMEOUT, until="terminal")
        await wait_status(engine, f"{uid}-r~2", "completed")
        second = await engine.get_run(f"{uid}-r~1")
        third = await engine.get_run(f"{uid}-r~2")
        third_out = await engine.get_handle(f"{uid}-r~2").result(timeout=RESULT_TIMEOUT)
        nothing = await engine.get_run(f"{uid}-r~3")

    assert first.status == "completed" and first.output is None and first.error is None
    assert second is not None and second.status == "completed" and second.input == 1
    assert second.output is None
    assert second.workflow == f"{uid}.loop"
    assert third is not None and third.input == 2
    assert third_out == "finished at 2"
    assert nothing is None
    assert sorted(set(seen)) == [0, 1, 2]


async def test_upsert_search_attributes_written_once(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.go"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        await ctx.upsert_search_attributes({"stage": "billing", "amount": 12.5})
        await ctx.wait_for_signal(token)
        await ctx.upsert_search_attributes({"stage": "done", "ok": True})
        return "ok"

    async with engine_factory() as engine:
        writes: list[dict[str, Any]] = []
        original = engine.store.update_run

        async def spy(run_id: str, patch: Any) -> Any:
            if "search_attributes" in patch:
                writes.append(dict(patch["search_attributes"]))
            return await original(run_id, patch)

        engine.store.update_run = spy  # type: ignore[method-assign]
        handle = await engine.start(wf, search_attributes={"tenant": "acme", "stage": "new"})
        await wait_waiting_on(engine, handle.run_id, token)
        mid = await engine.get_run(handle.run_id)
        await engine.signal(token)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "ok"
        final = await engine.get_run(handle.run_id)
        cps = await engine.list_checkpoints(handle.run_id)
        found = await engine.list_runs(
            attributes=[durably.AttributeFilter(key="stage", op="eq", value="done")]
        )

    assert mid is not None
    assert mid.search_attributes == {"tenant": "acme", "stage": "billing", "amount": 12.5}
    assert final is not None
    assert final.search_attributes == {
        "tenant": "acme",
        "stage": "done",
        "amount": 12.5,
        "ok": True,
    }
    # One store write per call site, never one per turn (replays do not rewrite).
    assert writes == [
        {"tenant": "acme", "stage": "billing", "amount": 12.5},
        {"tenant": "acme", "stage": "done", "amount": 12.5, "ok": True},
    ]
    assert shape(cps) == [
        (0, "searchAttributes", "local", "completed"),
        (1, f"signal:{token}", "signal", "completed"),
        (2, "searchAttributes", "local", "completed"),
    ]
    assert cps[0].output == {"stage": "billing", "amount": 12.5}
    assert [r.id for r in found] == [handle.run_id]


async def test_on_update_and_validator(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        first = await ctx.on_update("set-limit")
        return {"limit": first}

    def validate(arg: Any) -> str | None:
        if not isinstance(arg, int) or arg < 0:
            return "limit must be a non-negative int"
        return None

    async with engine_factory() as engine:
        engine.register_update_validator(wf, "set-limit", validate)
        handle = await engine.start(wf)
        token = f"update:{handle.run_id}:set-limit"
        await wait_waiting_on(engine, handle.run_id, token)

        rejected = await engine.update(handle.run_id, "set-limit", -5)
        still = await engine.get_run(handle.run_id)
        waiters = await engine.store.list_signal_waiters(token)
        unknown = await engine.update(f"{uid}-nope", "set-limit", 1)
        accepted = await engine.update(handle.run_id, "set-limit", 7)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert rejected.accepted is False
    assert rejected.reason == "limit must be a non-negative int"
    assert still is not None and still.status == "suspended"  # untouched
    assert [w.run_id for w in waiters] == [handle.run_id]
    assert unknown.accepted is False and unknown.reason == f"run {uid}-nope not found"
    assert accepted.accepted is True and accepted.delivered is True
    assert out == {"limit": 7}
    assert shape(cps) == [(0, f"signal:{token}", "signal", "completed")]
    assert cps[0].output == 7


async def test_update_validator_that_raises_rejects(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.on_update("rename", timeout="5s")

    def validate(arg: Any) -> None:
        if not arg:
            raise ValueError("name must not be empty")

    async with engine_factory() as engine:
        engine.register_update_validator(f"{uid}.wf", "rename", validate)
        handle = await engine.start(wf)
        await wait_waiting_on(engine, handle.run_id, f"update:{handle.run_id}:rename")
        rejected = await engine.update(handle.run_id, "rename", "")
        accepted = await engine.update(handle.run_id, "rename", "bob")
        assert await handle.result(timeout=RESULT_TIMEOUT) == "bob"

    assert rejected.accepted is False and rejected.reason == "name must not be empty"
    assert accepted.accepted is True


async def test_update_before_the_wait_is_buffered(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        await ctx.sleep("100ms")
        return await ctx.on_update("go")

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await wait_until(lambda: _has_status(engine, handle.run_id, "suspended"))
        result = await engine.update(handle.run_id, "go", {"k": 1})
        assert await handle.result(timeout=RESULT_TIMEOUT) == {"k": 1}

    assert result.accepted is True
    assert result.delivered is False  # nothing waited yet: the update was buffered


async def _has_status(engine: durably.Engine, run_id: str, status: str) -> bool:
    run = await engine.get_run(run_id)
    return run is not None and run.status == status


async def test_continue_as_new_result_with_typed_output(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.counter")
    async def counter_wf(ctx: WorkflowCtx, n: int) -> int:
        if n == 0:
            ctx.continue_as_new(1)
        return n * 10

    async with engine_factory() as engine:
        handle = await engine.start(counter_wf, 0, run_id=f"{uid}-c")
        await wait_status(engine, f"{uid}-c~1", "completed")
        nxt = await engine.get_handle(f"{uid}-c~1").result(timeout=RESULT_TIMEOUT)
        row = await engine.get_run(handle.run_id)
        first = await handle.result(timeout=RESULT_TIMEOUT)

    assert nxt == 10
    assert row is not None and row.status == "completed" and row.output is None
    assert first is None


async def test_child_that_continues_as_new_resolves_none(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.counter")
    async def counter_wf(ctx: WorkflowCtx, n: int) -> int:
        if n == 0:
            ctx.continue_as_new(1)
        return n * 10

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        return {"child": await ctx.child(counter_wf, 0, id=f"{uid}-kid")}

    async with engine_factory() as engine:
        handle = await engine.start(parent)
        run = await engine.wait_for_run(handle.run_id, timeout=RESULT_TIMEOUT, until="terminal")
        await wait_status(engine, f"{uid}-kid~1", "completed")

    assert run.error is None, run.error
    assert run.status == "completed"
    assert run.output == {"child": None}
