"""Run priority: pending runs are picked up by priority (higher first; a run without one
counts as 0), then oldest; child runs, fan members, continuations and fix-and-replay retries
carry it; a step sent over a transport carries its run's.

The pick-up and carrying tests run on SQLite and PostgreSQL (a fresh schema per test,
tests/pg_support.py); the checks that need no database order run through `engine_factory`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Client, Engine, EngineEvent, InMemoryStateStore, Queue, WorkflowCtx, WorkflowRun
from durably.transports import InMemoryTransport
from tests.engine_support import FAST_TUNING, RESULT_TIMEOUT, EngineFactory
from tests.pg_support import fresh_schema, schema_url


@pytest.fixture(params=["sqlite", "postgres"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/priority.db"
        return
    async with fresh_schema() as schema:
        yield schema_url(schema)


async def until(predicate: Callable[[], bool], timeout: float = RESULT_TIMEOUT) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - polls a plain list, not an event
            await asyncio.sleep(0.01)


async def get(engine: Engine, run_id: str) -> WorkflowRun:
    run = await engine.get_run(run_id)
    assert run is not None, run_id
    return run


# ------------------------------------------------------------------ pick-up order


async def test_a_backlog_is_picked_up_by_priority_then_age(store_url: str, uid: str) -> None:
    """One run at a time over a backlog another process created: the urgent runs go first
    even though they are younger, a run without a priority is a run of priority 0 (ties by
    age), negative priorities wait for everything else; and a high-priority run that arrives
    while the engine is busy is the next one taken, ahead of the older backlog."""
    gate = asyncio.Event()
    running = [0, 0]  # now, most at once

    @durably.workflow(f"{uid}.job")
    async def job(ctx: WorkflowCtx, label: str) -> str:
        running[0] += 1
        running[1] = max(running)
        if label == "first-high":
            await gate.wait()  # hold the only slot while the late arrival comes in
        await asyncio.sleep(0.01)  # a claim racing this one would run it alongside
        running[0] -= 1
        return label

    # (label, priority), oldest first; ids sort in creation order, so same-millisecond
    # creations tie-break by id in the same order as by age.
    backlog = [
        ("low", 1),
        ("none", None),
        ("negative", -5),
        ("first-high", 10),
        ("first-mid", 5),
        ("second-high", 10),
        ("zero", 0),
        ("second-mid", 5),
    ]
    ids = {label: f"{uid}-{i:02d}-{label}" for i, (label, _) in enumerate(backlog)}
    async with Client(store_url) as client:
        for label, priority in backlog:
            await client.start(job, label, run_id=ids[label], priority=priority)
        stored = await client.get_run(ids["none"])
        assert stored is not None and stored.priority is None  # none stays none

    started: list[str] = []

    def on_event(event: EngineEvent) -> None:
        if event.type == "run.started":
            started.append(event.run_id)

    engine = Engine(store=store_url, workflows=[job], max_concurrent_runs=1, **FAST_TUNING)
    engine.subscribe(on_event)
    async with engine, Client(store_url) as late_client:
        await until(lambda: len(started) == 1)
        assert started == [ids["first-high"]]
        # Arrives last, while the only slot is busy: it must still be the next one taken.
        await late_client.start(job, "urgent", run_id=f"{uid}-99-urgent", priority=50)
        await asyncio.sleep(0.2)  # several polls while the slot is held: nothing else starts
        assert started == [ids["first-high"]]
        gate.set()
        await until(lambda: len(started) == len(backlog) + 1)
        for run_id in started:
            assert (await engine.wait_for_run(run_id, timeout=RESULT_TIMEOUT)) is not None

    assert running[1] == 1  # max_concurrent_runs holds, or the order would mean nothing
    assert started == [
        ids["first-high"],
        f"{uid}-99-urgent",
        ids["second-high"],
        ids["first-mid"],
        ids["second-mid"],
        ids["low"],
        ids["none"],  # None counts as 0 and is older than "zero"
        ids["zero"],
        ids["negative"],
    ]


async def test_runs_started_by_the_engine_itself_respect_max_concurrent_runs(
    store_url: str, uid: str
) -> None:
    """Starts made through the engine that drives them (not only a backlog another process
    left) wait for room: never more than `max_concurrent_runs` execute at once, and the ones
    that waited are taken by priority, then age."""
    gate = asyncio.Event()
    running = [0, 0]  # now, most at once
    order: list[str] = []

    @durably.workflow(f"{uid}.job")
    async def job(ctx: WorkflowCtx, label: str) -> str:
        running[0] += 1
        running[1] = max(running)
        order.append(label)
        await gate.wait()  # hold the slot until every start has been made
        await asyncio.sleep(0.005)
        running[0] -= 1
        return label

    async with Engine(
        store=store_url, workflows=[job], max_concurrent_runs=2, **FAST_TUNING
    ) as engine:
        # Ids that sort in creation order: same-millisecond starts tie-break by id.
        handles = [await engine.start(job, f"n{i}", run_id=f"{uid}-{i:02d}") for i in range(6)]
        handles.append(await engine.start(job, "urgent", run_id=f"{uid}-99", priority=9))
        await until(lambda: len(order) >= 2)
        await asyncio.sleep(0.2)  # several polls while both slots are held
        assert sorted(order) == ["n0", "n1"]
        gate.set()
        results = [await h.result(timeout=RESULT_TIMEOUT) for h in handles]
    assert results == [f"n{i}" for i in range(6)] + ["urgent"]
    assert running[1] == 2
    # The waiting starts were claimed by priority, then age, two at a time (the two of a
    # claim start in either order): the urgent one came with the oldest waiting one.
    assert sorted(order[2:4]) == ["n2", "urgent"], order
    assert sorted(order[4:]) == ["n3", "n4", "n5"], order


async def test_a_run_holds_one_slot_and_a_parked_run_none(store_url: str, uid: str) -> None:
    """`max_concurrent_runs` counts the runs executing here, each once: with a cap of 2, a
    second run starts while the first executes. A run whose body waits for a signal holds no
    slot: a start queued behind two runs runs as soon as they park, without waiting for a
    poll. (A run waiting on its own step keeps its slot: tests/flow/test_fleet.py.)"""
    gate = asyncio.Event()
    running: list[str] = []

    @durably.workflow(f"{uid}.busy")
    async def busy(ctx: WorkflowCtx, label: str) -> str:
        running.append(label)
        await gate.wait()  # executing, not parked: it holds its slot
        return label

    @durably.workflow(f"{uid}.waits")
    async def waits(ctx: WorkflowCtx, label: str) -> str:
        return str(await ctx.wait_for_signal(f"{uid}:go:{label}"))

    @durably.workflow(f"{uid}.quick")
    async def quick(ctx: WorkflowCtx, x: int) -> int:
        return x

    # Polls far apart: only the engine's own kicks can pick the backlog up in time.
    tuning = {**FAST_TUNING, "timer_poll_ms": 60_000}
    async with Engine(
        store=store_url, workflows=[busy, waits, quick], max_concurrent_runs=2, **tuning
    ) as engine:
        first = await engine.start(busy, "a", run_id=f"{uid}-a")
        await until(lambda: running == ["a"])
        second = await engine.start(busy, "b", run_id=f"{uid}-b")
        await until(lambda: running == ["a", "b"])  # one slot each, not two
        gate.set()
        assert [await first.result(timeout=RESULT_TIMEOUT), await second.result()] == ["a", "b"]

        parked = [await engine.start(waits, n, run_id=f"{uid}-w{n}") for n in ("1", "2")]
        queued = await engine.start(quick, 7, run_id=f"{uid}-q")  # no room yet: queued
        assert await queued.result(timeout=RESULT_TIMEOUT) == 7
        for handle, n in zip(parked, ("1", "2"), strict=True):
            assert (await engine.get_run(handle.run_id)).status == "suspended"  # type: ignore[union-attr]
            await engine.signal(f"{uid}:go:{n}", n)
            assert await handle.result(timeout=RESULT_TIMEOUT) == n


async def test_a_run_waiting_for_a_queue_slot_keeps_its_slot(store_url: str, uid: str) -> None:
    """A run whose step waits to be admitted by a flow-control queue is still at work: it
    keeps its slot under `max_concurrent_runs`, so a third run waits for room."""
    release = asyncio.Event()
    started: list[str] = []

    @durably.step(f"{uid}.call")
    async def call(label: str) -> str:
        started.append(label)
        await release.wait()
        return label

    @durably.workflow(f"{uid}.uses")
    async def uses(ctx: WorkflowCtx, label: str) -> str:
        return await ctx.step(call, label, queue="one")

    @durably.workflow(f"{uid}.quick")
    async def quick(ctx: WorkflowCtx, x: int) -> int:
        started.append(f"quick{x}")
        return x

    async with Engine(
        store=store_url,
        workflows=[uses, quick],
        max_concurrent_runs=2,
        queues=[Queue("one", concurrency=1, retry=0.05)],
        **FAST_TUNING,
    ) as engine:
        holder = await engine.start(uses, "a", run_id=f"{uid}-a")
        await until(lambda: started == ["a"])
        waiter = await engine.start(uses, "b", run_id=f"{uid}-b")  # its step waits for "one"
        await asyncio.sleep(0.1)
        queued = await engine.start(quick, 1, run_id=f"{uid}-q")
        await asyncio.sleep(0.3)  # several polls and queue retries
        assert started == ["a"]  # "b" waits for the queue, "quick1" for room
        release.set()
        assert await holder.result(timeout=RESULT_TIMEOUT) == "a"
        assert await waiter.result(timeout=RESULT_TIMEOUT) == "b"
        assert await queued.result(timeout=RESULT_TIMEOUT) == 1


class _HeldClaimStore(InMemoryStateStore):
    """The reference store, whose first pick-up claim waits until the test lets it go: the
    claim's room was counted before starts made meanwhile took it."""

    def __init__(self) -> None:
        super().__init__()
        self.claim_entered = asyncio.Event()
        self.let_claim_go = asyncio.Event()

    async def claim_pending_runs(
        self,
        owner: str,
        lease_until_ms: int,
        now_ms: int,
        limit: int,
        namespace: str | None = None,
    ) -> list[WorkflowRun]:
        if not self.claim_entered.is_set():
            self.claim_entered.set()
            await self.let_claim_go.wait()
        return await super().claim_pending_runs(owner, lease_until_ms, now_ms, limit, namespace)


async def test_a_claim_in_flight_while_starts_take_the_room_gives_back_the_surplus(
    uid: str,
) -> None:
    """The boot pick-up counts two free slots and its claim is in flight; two starts made
    meanwhile run at once (there was room), then the claim returns two more runs: they are
    given back, not run as a third and fourth, and run when the slots free up."""
    store = _HeldClaimStore()
    gate = asyncio.Event()
    running = [0, 0]  # now, most at once
    order: list[str] = []

    @durably.workflow(f"{uid}.job")
    async def job(ctx: WorkflowCtx, label: str) -> str:
        running[0] += 1
        running[1] = max(running)
        order.append(label)
        await gate.wait()
        running[0] -= 1
        return label

    async with Engine(store=store, workflows=[job], max_concurrent_runs=2, **FAST_TUNING) as engine:
        await asyncio.wait_for(store.claim_entered.wait(), RESULT_TIMEOUT)
        handles = [await engine.start(job, f"n{i}", run_id=f"{uid}-{i:02d}") for i in range(4)]
        handles.append(await engine.start(job, "urgent", run_id=f"{uid}-99", priority=9))
        await until(lambda: len(order) >= 2)
        store.let_claim_go.set()  # returns "urgent" and "n2", with no room left for them
        await asyncio.sleep(0.2)
        assert sorted(order) == ["n0", "n1"]
        assert running[1] == 2
        given_back = await store.get_run(f"{uid}-99")
        assert given_back is not None and given_back.status == "pending"
        gate.set()
        results = [await h.result(timeout=RESULT_TIMEOUT) for h in handles]
    assert results == ["n0", "n1", "n2", "n3", "urgent"]
    assert running[1] == 2
    assert order[2] == "urgent", order


# ------------------------------------------------------------------ carried priority


async def test_children_fans_and_continuations_carry_the_priority(store_url: str, uid: str) -> None:
    @durably.workflow(f"{uid}.leaf")
    async def leaf(ctx: WorkflowCtx, x: int) -> int:
        return x

    @durably.workflow(f"{uid}.again")
    async def again(ctx: WorkflowCtx, n: int) -> int:
        if n < 1:
            ctx.continue_as_new(n + 1)
        return n

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> list[Any]:
        inherited = await ctx.child(leaf, 1)  # seq 0
        own = await ctx.child(leaf, 2, priority=2)  # seq 1
        spawned = await ctx.start_child(leaf, 3)  # seq 2
        fan = await ctx.all(leaf, [4, 5])  # seqs 3-4
        settled = await ctx.all_settled(leaf, [6], priority=-1)  # seq 5
        windowed = await ctx.all(leaf, [7, 8], concurrency=1, priority=0)  # seqs 6-7
        return [inherited, own, spawned, fan, len(settled), windowed]

    async with Engine(store=store_url, workflows=[leaf, again, parent], **FAST_TUNING) as engine:
        handle = await engine.start(parent, run_id=f"{uid}-p", priority=7)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        assert out == [1, 2, f"{uid}-p.child.2", [4, 5], 1, [7, 8]]
        priorities = {
            run_id: (await get(engine, run_id)).priority
            for run_id in (
                f"{uid}-p",
                f"{uid}-p.child.0",
                f"{uid}-p.child.1",
                f"{uid}-p.child.2",
                f"{uid}-p.all.3.0",
                f"{uid}-p.all.3.1",
                f"{uid}-p.all.5.0",
                f"{uid}-p.all.6.w0.0",
                f"{uid}-p.all.6.w1.1",
            )
        }
        assert priorities == {
            f"{uid}-p": 7,
            f"{uid}-p.child.0": 7,  # inherited
            f"{uid}-p.child.1": 2,  # given
            f"{uid}-p.child.2": 7,  # start_child inherits too
            f"{uid}-p.all.3.0": 7,  # fan members inherit
            f"{uid}-p.all.3.1": 7,
            f"{uid}-p.all.5.0": -1,  # unless the fan is given one
            f"{uid}-p.all.6.w0.0": 0,  # 0 is a priority, not "none"
            f"{uid}-p.all.6.w1.1": 0,
        }

        # A continuation is the same logical run: it keeps the priority.
        await engine.start(again, 0, run_id=f"{uid}-a", priority=4)
        await engine.wait_for_run(f"{uid}-a", timeout=RESULT_TIMEOUT)
        async with asyncio.timeout(RESULT_TIMEOUT):
            # The successor is created just after the origin settles.
            while await engine.get_run(f"{uid}-a~1") is None:  # noqa: ASYNC110 - polls the store
                await asyncio.sleep(0.01)
        done = await engine.wait_for_run(f"{uid}-a~1", timeout=RESULT_TIMEOUT)
        assert done is not None and done.status == "completed"
        assert (await get(engine, f"{uid}-a~1")).priority == 4

        # A fix-and-replay run is as urgent as the run it replaces.
        await engine.execute(leaf, 1, run_id=f"{uid}-l", priority=2, timeout=RESULT_TIMEOUT)
        new_id = await engine.retry_with_input(f"{uid}-l", 20)
        assert new_id is not None
        assert (await get(engine, new_id)).priority == 2
        assert (await engine.wait_for_run(new_id, timeout=RESULT_TIMEOUT)) is not None
        # A run started without a priority has none, and neither have its children.
        plain = await engine.start(parent, run_id=f"{uid}-q")
        await plain.result(timeout=RESULT_TIMEOUT)
        assert (await get(engine, f"{uid}-q")).priority is None
        assert (await get(engine, f"{uid}-q.child.0")).priority is None
        assert (await get(engine, f"{uid}-q.all.3.1")).priority is None


async def test_a_client_start_by_name_carries_the_priority(store_url: str, uid: str) -> None:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return x + 1

    async with Client(store_url) as client:
        await client.start(wf.name, 1, run_id=f"{uid}-n", priority=3)
        run = await client.get_run(f"{uid}-n")
    assert run is not None and run.priority == 3 and run.status == "pending"
    async with Engine(store=store_url, workflows=[wf], **FAST_TUNING) as engine:
        done = await engine.wait_for_run(f"{uid}-n", timeout=RESULT_TIMEOUT)
        assert done is not None and done.status == "completed" and done.priority == 3


# ------------------------------------------------------------------ bad priorities


@pytest.mark.parametrize("bad", ["high", 1.5, True, 2**31, -(2**31) - 1])
async def test_a_bad_priority_is_refused_at_the_call_and_creates_nothing(
    engine_factory: EngineFactory, uid: str, bad: Any
) -> None:
    @durably.workflow(f"{uid}.leaf")
    async def leaf(ctx: WorkflowCtx, x: int) -> int:
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[str]:
        errors = []
        for attempt in (
            lambda: ctx.child(leaf, 1, priority=bad),
            lambda: ctx.start_child(leaf, 1, priority=bad),
            lambda: ctx.all(leaf, [1], priority=bad),
        ):
            try:
                attempt()
            except ValueError as exc:
                errors.append(str(exc))
        return errors

    async with engine_factory() as engine:
        with pytest.raises(ValueError, match="priority must be"):
            await engine.start(wf, run_id=f"{uid}-a", priority=bad)
        with pytest.raises(ValueError, match="priority must be"):
            await engine.start(wf.name, run_id=f"{uid}-b", priority=bad)
        assert await engine.get_run(f"{uid}-a") is None
        assert await engine.get_run(f"{uid}-b") is None
        # the extremes of the stored range are fine
        for edge, suffix in ((2**31 - 1, "max"), (-(2**31), "min")):
            await engine.start(leaf, 1, run_id=f"{uid}-{suffix}", priority=edge)
            assert (await get(engine, f"{uid}-{suffix}")).priority == edge
        errors = await engine.execute(wf, run_id=f"{uid}-c", timeout=RESULT_TIMEOUT)
        # refused before any position was claimed: nothing was started or recorded
        assert await engine.list_checkpoints(f"{uid}-c") == []
    assert [e.split(":")[0] for e in errors] == ["ctx.child", "ctx.start_child", "ctx.all"]
    assert all("priority must be" in e for e in errors)


# ------------------------------------------------------------------ remote steps


async def test_a_remote_step_task_carries_its_runs_priority(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.step(f"{uid}.inc")
    async def inc(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> list[int]:
        return [await ctx.step(inc, x), *await ctx.all(inc, [x, x])]

    transport = InMemoryTransport()
    async with engine_factory(transport=transport, steps=[inc]) as engine:
        assert await engine.execute(wf, 1, run_id=f"{uid}-hi", priority=9) == [2, 2, 2]
        assert await engine.execute(wf, 1, run_id=f"{uid}-no") == [2, 2, 2]
    sent = {(t.run_id, t.priority) for t in transport.broker.dispatched}
    assert sent == {(f"{uid}-hi", 9), (f"{uid}-no", None)}
