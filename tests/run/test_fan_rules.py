"""Fan rules not pinned by test_fans.py.

Message and member ids of GatherError / Rejected, the parallel group of every member, codes and
details travelling from a failed member to the parent, fail_fast with waves (no later wave is
ever created), seq accounting around fans (a fan of N claims exactly N seqs, an empty one
none), what all_settled still propagates (non-determinism, cancellation of the parent) and
wide fans (2,000 steps, 500 child workflows) on every store and mode.
"""

from __future__ import annotations

import asyncio
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
    StepCheckpoint,
    WorkflowCtx,
)
from tests.engine_support import (
    RESULT_TIMEOUT,
    EngineFactory,
    bump,
    shape,
    turn_ended,
    wait_status,
    wait_until,
    wait_waiting_on,
)


def _failures(exc: GatherError) -> list[tuple[int, str, str, str | None, Any]]:
    return [(f.index, f.id, f.error, f.code, f.details) for f in exc.failures]


def _group_of(cp: StepCheckpoint) -> list[str]:
    """`all:<firstSeq>` of a member's group, plain or extended (`all:<first>:<total>[:ff]`)."""
    assert cp.parallel_group is not None, cp
    return cp.parallel_group.split(":")[:2]


# ---------------------------------------------------------------- (a) GatherError message


async def test_gather_error_message_for_step_and_wave_fans(engine_factory: EngineFactory, uid: str):
    @durably.step(f"{uid}.check")
    def check(x: int) -> int:
        if x in (1, 2, 4):
            raise FatalError(f"bad {x}", code="BAD")
        return x

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        if x in (0, 3):
            raise FatalError(f"no {x}")
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        messages: list[Any] = []
        for fan in (
            lambda: ctx.all(check, [0, 1, 2, 3, 4], retries=0),
            lambda: ctx.all(child, [0, 1, 2, 3], concurrency=3),
            lambda: ctx.all(child, [5, 3]),
        ):
            try:
                await fan()
            except GatherError as exc:
                messages.append([str(exc), exc.total, [f.id for f in exc.failures]])
        return messages

    async with engine_factory() as engine:
        out = await engine.execute(wf, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)

    p = f"{uid}-p"
    step_ids = [f"{p}:1", f"{p}:2", f"{p}:4"]
    wave_ids = [f"{p}.all.5.w0.0", f"{p}.all.5.w1.3"]
    plain_ids = [f"{p}.all.9.1"]
    assert out == [
        [f"ctx.all: 3 of 5 child(ren) failed: {', '.join(step_ids)}", 5, step_ids],
        [f"ctx.all: 2 of 4 child(ren) failed: {', '.join(wave_ids)}", 4, wave_ids],
        [f"ctx.all: 1 of 2 child(ren) failed: {plain_ids[0]}", 2, plain_ids],
    ]


async def test_gather_error_unhandled_fails_the_parent_with_its_message(
    engine_factory: EngineFactory, uid: str
):
    @durably.step(f"{uid}.check")
    def check(x: int) -> int:
        if x:
            raise FatalError("odd", code="ODD")
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.all(check, [0, 1, 0, 1])

    async with engine_factory() as engine:
        handle = await engine.start(wf, run_id=f"{uid}-p")
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)

    assert info.value.error is not None
    assert info.value.error.message == (f"ctx.all: 2 of 4 child(ren) failed: {uid}-p:1, {uid}-p:3")


# ---------------------------------------------------------------- (b) member ids


async def test_workflow_fan_member_ids(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x + 100

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        await ctx.side_effect(lambda: 0)
        await ctx.side_effect(lambda: 1)
        plain = await ctx.all(child, [0, 1, 2])  # seqs 2..4
        waves = await ctx.all_settled(child, [10, 11, 12, 13, 14, 15, 16], concurrency=3)
        return [plain, [s.to_json() for s in waves]]

    async with engine_factory() as engine:
        out = await engine.execute(parent, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)
        p = f"{uid}-p"
        plain_ids = [f"{p}.all.2.{i}" for i in range(3)]
        wave_ids = [f"{p}.all.5.w{i // 3}.{i}" for i in range(7)]
        runs = [await engine.get_run(i) for i in plain_ids + wave_ids]
        children = await engine.get_run_children(p)
        # the other encodings name no run
        strays = [await engine.get_run(i) for i in (f"{p}.all.5.0", f"{p}.all.5.w0.3")]

    assert out == [
        [100, 101, 102],
        [{"status": "fulfilled", "value": 110 + i} for i in range(7)],
    ]
    assert [(r.id, r.input, r.status) if r else None for r in runs] == [
        (i, x, "completed")
        for i, x in zip(plain_ids + wave_ids, [0, 1, 2, *range(10, 17)], strict=True)
    ]
    assert sorted(children) == sorted(plain_ids + wave_ids)
    assert strays == [None, None]


async def test_step_fan_member_ids_in_rejected_and_failures(
    engine_factory: EngineFactory, uid: str
):
    @durably.step(f"{uid}.check")
    def check(x: int) -> int:
        if x % 2:
            raise FatalError(f"odd {x}")
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        await ctx.side_effect(lambda: 0)
        settled = await ctx.all_settled(check, [0, 1, 2, 3], concurrency=3)  # seqs 1..4
        try:
            await ctx.all(check, [5, 6, 7])  # seqs 5..7
        except GatherError as exc:
            return [[s.to_json() for s in settled], _failures(exc)]
        return None

    async with engine_factory() as engine:
        out = await engine.execute(wf, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(f"{uid}-p")

    p = f"{uid}-p"
    assert out == [
        [
            {"status": "fulfilled", "value": 0},
            {"status": "rejected", "id": f"{p}:2", "error": "odd 1"},
            {"status": "fulfilled", "value": 2},
            {"status": "rejected", "id": f"{p}:4", "error": "odd 3"},
        ],
        [
            [0, f"{p}:5", "odd 5", None, None],
            [2, f"{p}:7", "odd 7", None, None],
        ],
    ]
    assert [(cp.seq, cp.step_id) for cp in cps if cp.seq >= 1] == [
        (s, f"{p}:{s}") for s in range(1, 8)
    ]


# ---------------------------------------------------------------- (c) parallel groups


async def test_every_member_checkpoint_carries_the_fan_group(
    engine_factory: EngineFactory, uid: str
):
    @durably.step(f"{uid}.inc")
    def inc(x: int) -> int:
        return x + 1

    @durably.step(f"{uid}.solo")
    def solo(x: int) -> int:
        return x

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        if x == 3:
            raise FatalError("three")
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        await ctx.step(solo, 0)  # seq 0
        a = await ctx.all(inc, [1, 2, 3])  # 1..3
        b = await ctx.all_settled(child, [1, 2, 3, 4], concurrency=2)  # 4..7
        c = await ctx.all(child, [5, 6])  # 8..9
        d = await ctx.all_settled(inc, [7, 8, 9, 10, 11], concurrency=2)  # 10..14
        await ctx.step(solo, 1)  # 15
        return [a, [s.status for s in b], c, [s.status for s in d]]

    async with engine_factory() as engine:
        out = await engine.execute(parent, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(f"{uid}-p")

    assert out == [
        [2, 3, 4],
        ["fulfilled", "fulfilled", "rejected", "fulfilled"],
        [5, 6],
        ["fulfilled"] * 5,
    ]
    by_seq = {cp.seq: cp for cp in cps}
    assert sorted(by_seq) == list(range(16))
    assert by_seq[0].parallel_group is None and by_seq[15].parallel_group is None
    fans = {1: range(1, 4), 4: range(4, 8), 8: range(8, 10), 10: range(10, 15)}
    for first, seqs in fans.items():
        members = [by_seq[s] for s in seqs]
        assert all(_group_of(cp) == ["all", str(first)] for cp in members), members
        # one fan, one group (whatever extension the encoding carries)
        assert len({cp.parallel_group for cp in members}) == 1, members
        assert all(cp.status == "completed" for cp in members), members


# ---------------------------------------------------------------- (d) codes and details


async def test_child_code_and_details_reach_rejected_and_gather_failures(
    engine_factory: EngineFactory, uid: str
):
    details: list[Any] = [{"x": 1, "nested": [1, {"a": None}]}, ["l", 2], "text", 7, None]

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, i: int) -> int:
        if i == 0:
            return 0
        raise FatalError(f"failed {i}", code=f"E{i}", details=details[i - 1])

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        settled = await ctx.all_settled(child, range(6))  # seqs 0..5
        try:
            await ctx.all(child, range(6))  # seqs 6..11
        except GatherError as exc:
            return [[s.to_json() for s in settled], _failures(exc), exc.total]
        return None

    async with engine_factory() as engine:
        out = await engine.execute(parent, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)

    p = f"{uid}-p"
    rejected: list[dict[str, Any]] = []
    for i in range(1, 6):
        item: dict[str, Any] = {
            "status": "rejected",
            "id": f"{p}.all.0.{i}",
            "error": f"failed {i}",
            "code": f"E{i}",
        }
        if details[i - 1] is not None:
            item["details"] = details[i - 1]
        rejected.append(item)
    assert out == [
        [{"status": "fulfilled", "value": 0}, *rejected],
        [[i, f"{p}.all.6.{i}", f"failed {i}", f"E{i}", details[i - 1]] for i in range(1, 6)],
        6,
    ]


async def test_step_code_and_details_reach_rejected_and_gather_failures(
    engine_factory: EngineFactory, uid: str
):
    attempts: dict[str, int] = {}

    @durably.step(f"{uid}.check")
    def check(x: int) -> int:
        bump(attempts, str(x))
        if x == 1:
            raise FatalError("fatal", code="F1", details={"why": [x]})
        if x == 2:
            raise FatalError("no code", details="only details")
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        settled: list[Settled[int]] = await ctx.all_settled(check, [0, 1, 2], retries=3)
        try:
            await ctx.all(check, [1, 2], retries=3)
        except GatherError as exc:
            return [[s.to_json() for s in settled], _failures(exc)]
        return None

    async with engine_factory() as engine:
        out = await engine.execute(wf, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)

    p = f"{uid}-p"
    settled, failures = out
    assert [Settled.from_json(s) for s in settled] == [
        Fulfilled(0),
        Rejected(f"{p}:1", "fatal", code="F1", details={"why": [1]}),
        Rejected(f"{p}:2", "no code", details="only details"),
    ]
    assert failures == [
        [0, f"{p}:3", "fatal", "F1", {"why": [1]}],
        [1, f"{p}:4", "no code", None, "only details"],
    ]
    assert attempts == {"0": 1, "1": 2, "2": 2}  # FatalError is never retried


# ---------------------------------------------------------------- (e) fail_fast with waves


async def test_fail_fast_waves_never_create_a_later_wave(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        if x == 3:
            raise FatalError("three", code="THREE", details={"x": x})
        if x == 2:
            await ctx.wait_for_signal(f"{uid}.never")
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        try:
            await ctx.all(child, range(7), concurrency=2, mode="fail_fast")
        except GatherError as exc:
            return [str(exc), exc.total, _failures(exc)]
        return None

    async with engine_factory() as engine:
        out = await engine.execute(parent, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)
        p = f"{uid}-p"
        ids = [f"{p}.all.0.w{i // 2}.{i}" for i in range(7)]
        await wait_status(engine, ids[2], "cancelled")  # the wave's still-running sibling
        await asyncio.sleep(0.2)  # a late wave launch would have happened by now
        runs = [await engine.get_run(i) for i in ids]
        children = await engine.get_run_children(p)
        cps = await engine.list_checkpoints(p)

    assert out == [
        f"ctx.all: 1 of 7 child(ren) failed: {ids[3]}",
        7,
        [[3, ids[3], "three", "THREE", {"x": 3}]],
    ]
    assert [r.status if r else None for r in runs] == [
        "completed",
        "completed",
        "cancelled",
        "failed",
        None,
        None,
        None,
    ]
    assert sorted(children) == ids[:4]
    assert sorted(cp.seq for cp in cps) == [0, 1, 2, 3]  # no row for an unlaunched wave


async def test_fail_fast_step_waves_never_dispatch_a_later_wave(
    engine_factory: EngineFactory, uid: str
):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.check")
    async def check(x: int) -> int:
        bump(counts, str(x))
        if x == 1:
            raise FatalError("one", code="ONE")
        return x

    @durably.step(f"{uid}.after")
    def after(x: int) -> int:
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        try:
            await ctx.all(check, range(6), concurrency=2, mode="fail_fast")  # seqs 0..5
        except GatherError as exc:
            await ctx.step(after, 9)  # seq 6
            return [exc.total, _failures(exc)]
        return None

    async with engine_factory() as engine:
        out = await engine.execute(wf, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)
        await asyncio.sleep(0.2)
        cps = await engine.list_checkpoints(f"{uid}-p")

    assert out == [6, [[1, f"{uid}-p:1", "one", "ONE", None]]]
    assert set(counts) <= {"0", "1"} and counts["1"] == 1
    assert [(cp.seq, cp.name) for cp in cps if cp.seq >= 2] == [(6, f"{uid}.after")]


# ---------------------------------------------------------------- (f)/(g) seq accounting


async def test_seqs_after_a_fan_continue_at_first_plus_n(engine_factory: EngineFactory, uid: str):
    @durably.step(f"{uid}.mark")
    def mark(x: str) -> str:
        return x

    @durably.step(f"{uid}.inc")
    def inc(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        await ctx.step(mark, "a")  # 0
        await ctx.all(inc, range(4))  # 1..4
        await ctx.step(mark, "b")  # 5
        await ctx.all_settled(child, range(5), concurrency=2)  # 6..10
        await ctx.step(mark, "c")  # 11
        await ctx.all(child, [1], mode="fail_fast")  # 12
        await ctx.step(mark, "d")  # 13
        await ctx.all(inc, range(3), concurrency=5)  # 14..16
        return await ctx.step(mark, "e")  # 17

    async with engine_factory() as engine:
        out = await engine.execute(parent, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(f"{uid}-p")

    assert out == "e"
    marks = [(cp.seq, cp.output) for cp in cps if cp.name == f"{uid}.mark"]
    assert marks == [(0, "a"), (5, "b"), (11, "c"), (13, "d"), (17, "e")]


async def test_empty_fans_claim_no_seqs(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.mark")
    def mark(x: str) -> str:
        bump(counts, x)
        return x

    @durably.step(f"{uid}.inc")
    def inc(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        await ctx.step(mark, "a")  # 0
        empties = [
            await ctx.all(child, []),
            await ctx.all(inc, (), mode="fail_fast"),
            await ctx.all_settled(child, iter([]), concurrency=3),
            await ctx.all_settled(inc, [], concurrency=1),
            await ctx.all(child, [], concurrency=2, mode="fail_fast"),
        ]
        await ctx.step(mark, "b")  # 1
        one = await ctx.all(inc, [41])  # 2
        await ctx.step(mark, "c")  # 3
        return [empties, one]

    async with engine_factory() as engine:
        out = await engine.execute(parent, run_id=f"{uid}-p", timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(f"{uid}-p")
        children = await engine.get_run_children(f"{uid}-p")

    assert out == [[[], [], [], [], []], [42]]
    assert [(cp.seq, cp.name) for cp in cps] == [
        (0, f"{uid}.mark"),
        (1, f"{uid}.mark"),
        (2, f"{uid}.inc"),
        (3, f"{uid}.mark"),
    ]
    assert children == []
    assert counts == {"a": 1, "b": 1, "c": 1}


# ---------------------------------------------------------------- (h) what all_settled propagates


async def test_all_settled_propagates_non_determinism(engine_factory: EngineFactory, uid: str):
    state = {"version": 1}
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.sq")
    def sq(x: int) -> int:
        bump(counts, "sq")
        return x * x

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        await ctx.wait_for_signal(f"{uid}.go.{x}")
        if x == 1:
            raise FatalError("one", code="ONE")
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        if state["version"] == 1:
            settled = await ctx.all_settled(child, [0, 1])
        else:  # the code changed under the in-flight run: a step fan at the same seqs
            settled = await ctx.all_settled(sq, [0, 1])
        return [s.status for s in settled]

    async with engine_factory() as engine:
        handle = await engine.start(parent, run_id=f"{uid}-p")
        for x in (0, 1):
            await wait_waiting_on(engine, f"{uid}-p.all.0.{x}", f"{uid}.go.{x}")
        await wait_status(engine, handle.run_id, "suspended")
    state["version"] = 2
    async with engine_factory() as engine:
        for x in (0, 1):
            await engine.signal(f"{uid}.go.{x}", None)
        with pytest.raises(RunFailedError) as info:
            await engine.get_handle(handle.run_id).result(timeout=RESULT_TIMEOUT)
        # The parent fails at its first turn here (its replay meets the step fan), which may
        # come before the signalled children have finished: wait for them to end.
        for x in (0, 1):
            await engine.wait_for_run(
                f"{uid}-p.all.0.{x}", timeout=RESULT_TIMEOUT, until="terminal"
            )
        kids = [await engine.get_run(f"{uid}-p.all.0.{x}") for x in (0, 1)]

    error = info.value.error
    assert error is not None and error.code == "non_determinism", error
    assert f"non-determinism at {uid}-p#0" in error.message
    assert f'recorded "signal:child:{uid}-p.all.0.0"' in error.message
    assert counts == {}  # no member of the new fan ran
    assert [k.status if k else None for k in kids] == ["completed", "failed"]


async def test_all_settled_propagates_cancellation_of_the_parent(
    engine_factory: EngineFactory, uid: str
):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.after")
    def after(x: int) -> int:
        bump(counts, "after")
        return x

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        if x == 1:
            raise FatalError("one")
        if x >= 2:
            await ctx.wait_for_signal(f"{uid}.never.{x}")
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> Any:
        settled = await ctx.all_settled(child, range(4))
        await ctx.step(after, 1)
        return [s.status for s in settled]

    async with engine_factory() as engine:
        handle = await engine.start(parent, run_id=f"{uid}-p")
        p = handle.run_id
        ids = [f"{p}.all.0.{i}" for i in range(4)]
        await wait_status(engine, ids[0], "completed")
        await wait_status(engine, ids[1], "failed")
        for x in (2, 3):
            await wait_waiting_on(engine, ids[x], f"{uid}.never.{x}")
        await wait_status(engine, p, "suspended")

        result = await engine.cancel(p)
        parent_row = await wait_status(engine, p, "cancelled")
        kids = [await wait_status(engine, i, "completed", "failed", "cancelled") for i in ids]
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        # a late signal resurrects nothing
        await engine.signal(f"{uid}.never.2", "late")
        await asyncio.sleep(0.1)
        parent_after = await engine.get_run(p)

    assert result is not None and result.status == "cancelled"
    assert info.value.status == "cancelled"
    assert parent_row.error is not None and parent_row.error.message == "cancelled"
    assert [k.status for k in kids] == ["completed", "failed", "cancelled", "cancelled"]
    assert parent_after is not None and parent_after.status == "cancelled"
    assert counts == {}


# ---------------------------------------------------------------- (i) wide fans


async def test_fan_of_2000_steps(engine_factory: EngineFactory, uid: str):
    seen: set[int] = set()

    @durably.step(f"{uid}.sq")
    def sq(x: int) -> int:
        seen.add(x)
        return x * x

    @durably.step(f"{uid}.mark")
    def mark(x: int) -> int:
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, n: int) -> Any:
        out = await ctx.all(sq, range(n))
        after = await ctx.step(mark, n)
        return [out, after]

    n = 2000
    async with engine_factory() as engine:
        out = await engine.execute(wf, n, run_id=f"{uid}-p", timeout=30)
        cps = await engine.list_checkpoints(f"{uid}-p")

    assert out == [[x * x for x in range(n)], n]
    assert seen == set(range(n))
    assert cps[-1].seq == n and cps[-1].name == f"{uid}.mark"


async def test_fan_of_500_child_workflows(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x * 3

    @durably.step(f"{uid}.mark")
    def mark(x: int) -> int:
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx, n: int) -> Any:
        out = await ctx.all(child, range(n))
        after = await ctx.step(mark, n)
        return [out, after]

    n = 500
    async with engine_factory() as engine:
        out = await engine.execute(parent, n, run_id=f"{uid}-p", timeout=30)
        runs = [await engine.get_run(f"{uid}-p.all.0.{i}") for i in (0, 250, n - 1)]
        cps = await engine.list_checkpoints(f"{uid}-p")

    assert out == [[x * 3 for x in range(n)], n]
    assert [(r.status, r.output) if r else None for r in runs] == [
        ("completed", 0),
        ("completed", 750),
        ("completed", (n - 1) * 3),
    ]
    assert cps[-1].seq == n and cps[-1].name == f"{uid}.mark"


# ---------------------------------------------------------------- completion vs placeholder


def _delay_child_placeholders(engine: Any, *, patience: float = 0.5) -> list[str]:
    """Hold back every `running` `signal:child:` placeholder write until the child's
    completion has been delivered at that seq (or `patience` passes): the interleaving a
    slow store round trip produces when the child finishes between the parent's
    `put_signal_waiter` and its placeholder write. Returns the names of
    the placeholders that were written after the delivery."""
    store = engine.store
    original = store.save_checkpoint
    late: list[str] = []

    async def save_checkpoint(cp: StepCheckpoint) -> None:
        if cp.status == "running" and cp.name.startswith("signal:child:"):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + patience
            while loop.time() < deadline:
                row = await store.get_checkpoint(cp.run_id, cp.seq)
                if row is not None and row.status == "completed":
                    late.append(cp.name)
                    break
                await asyncio.sleep(0.005)
        await original(cp)

    store.save_checkpoint = save_checkpoint
    return late


async def test_child_completion_delivered_before_the_placeholder_write(
    engine_factory: EngineFactory, uid: str
):
    """Was an engine bug (ctx.py `_child` wrote the placeholder after the waiter, so a
    completion landing in between was overwritten and the parent hung): now the waiter and
    an insert-if-absent placeholder share one transaction (children.register_waits)."""

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> int:
        return await ctx.child(child, 1)

    async with engine_factory() as engine:
        late = _delay_child_placeholders(engine)
        handle = await engine.start(parent, run_id=f"{uid}-p")
        kid_id = f"{uid}-p.child.0"

        async def hung() -> bool:
            """The bug's end state: the child completed (its completion was delivered, so
            nothing is buffered and no wake will ever come again), the parent is suspended
            with its row at seq 0 back to `running`."""
            run = await engine.get_run(handle.run_id)
            kid = await engine.get_run(kid_id)
            row = await engine.store.get_checkpoint(handle.run_id, 0)
            return (
                run is not None
                and run.status == "suspended"
                and kid is not None
                and kid.status == "completed"
                and row is not None
                and row.status == "running"
                and turn_ended(engine, handle.run_id)
            )

        async def settled_or_hung() -> bool:
            run = await engine.get_run(handle.run_id)
            return (run is not None and run.status == "completed") or await hung()

        await wait_until(settled_or_hung, timeout=RESULT_TIMEOUT)
        await asyncio.sleep(0.3)  # a late wake would have resolved it by now
        if await hung():
            cps = await engine.list_checkpoints(handle.run_id)
            raise AssertionError(
                f"parent hangs: checkpoints {shape(cps)}, child completed, placeholders "
                f"written after the delivery: {late}"
            )
        result = await handle.result(timeout=RESULT_TIMEOUT)

    assert result == 2
