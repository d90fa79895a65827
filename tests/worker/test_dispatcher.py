"""`Dispatcher` alone, with a fake turn runner: one turn of a run at a time here, exactly one
more queued behind it, nothing new once draining, and the background tasks it tracks."""

from __future__ import annotations

import asyncio
from typing import Any

from durably._core.models import WorkflowRun
from durably._engine.worker.dispatcher import Dispatcher
from durably._store.memory import InMemoryStateStore

from .fakes import INSTANCE, pending_run

WAIT = 5.0


class Turns:
    """`TurnRunner`: each turn waits for the test to end it (when `gated`)."""

    def __init__(self, *, acquired: bool = True, gated: bool = True) -> None:
        self.acquired = acquired
        self.gated = gated
        self.turns: list[tuple[str, asyncio.Future[None]]] = []
        self.driven: list[WorkflowRun] = []
        self.started = asyncio.Event()
        self.running = 0
        self.most = 0

    async def run_one(self, run_id: str) -> bool:
        gate = asyncio.get_running_loop().create_future()
        self.turns.append((run_id, gate))
        self.running += 1
        self.most = max(self.most, self.running)
        self.started.set()
        try:
            if self.gated:
                await gate
        finally:
            self.running -= 1
        return self.acquired

    async def drive(self, run: WorkflowRun) -> None:
        self.driven.append(run)

    async def next_start(self) -> None:
        await asyncio.wait_for(self.started.wait(), WAIT)
        self.started.clear()

    def end(self, index: int) -> None:
        self.turns[index][1].set_result(None)


def dispatcher(
    turns: Turns, *, drive_runs: bool = True, idle: Any = (), store: Any = None
) -> tuple[Dispatcher, list[str], list[None]]:
    nudged: list[str] = []
    after: list[None] = []

    async def nudge(run_id: str) -> None:
        nudged.append(run_id)

    d = Dispatcher(store or InMemoryStateStore(), drive_runs=drive_runs, idle=idle)
    d.connect(turns, nudge=nudge, after_turn=lambda: after.append(None))
    return d, nudged, after


async def test_one_turn_of_a_run_at_a_time_and_exactly_one_more_queued() -> None:
    turns = Turns()
    d, _, after = dispatcher(turns)
    d.dispatch("r")
    await turns.next_start()
    # Three more requests while the turn runs: they fold into ONE more turn after it.
    for _ in range(3):
        d.dispatch("r")
    assert [run_id for run_id, _ in turns.turns] == ["r"]
    assert d.holds("r") and d.load == 1
    turns.end(0)
    await turns.next_start()
    assert len(turns.turns) == 2 and turns.most == 1
    turns.end(1)
    await d.wait_idle(WAIT)
    assert len(turns.turns) == 2  # nothing queued behind the second turn
    assert not d.holds("r") and d.load == 0 and not d.busy
    assert len(after) == 1  # one dispatch (two turns) ends once


async def test_turns_of_different_runs_run_side_by_side() -> None:
    turns = Turns()
    d, _, _ = dispatcher(turns)
    d.dispatch("a")
    d.dispatch("b")
    await turns.next_start()
    while len(turns.turns) < 2:
        await turns.next_start()
    assert turns.most == 2 and d.load == 2
    turns.end(0)
    turns.end(1)
    await d.wait_idle(WAIT)
    assert d.load == 0


async def test_nothing_new_once_draining_and_a_leased_run_is_given_back() -> None:
    store = InMemoryStateStore()
    await store.create_run(pending_run("r"))
    leased = await store.claim_run("r", INSTANCE, 10_000, 0)
    assert leased is not None and leased.locked_by == INSTANCE
    turns = Turns()
    d, _, _ = dispatcher(turns, store=store)
    d.begin_drain()
    d.dispatch("q")
    d.dispatch("r", claimed=leased)
    await d.wait_idle(WAIT)
    await asyncio.gather(*d.pending_tasks())
    assert turns.turns == [] and turns.driven == []
    assert not d.holds("q") and not d.holds("r")
    row = await store.get_run("r")
    assert row is not None and row.locked_by is None  # its lease was released at once
    d.reopen()
    d.dispatch("q")
    await turns.next_start()
    turns.end(0)
    await d.wait_idle(WAIT)


async def test_a_control_replica_runs_no_turn() -> None:
    turns = Turns()
    d, _, _ = dispatcher(turns, drive_runs=False)
    d.dispatch("r")
    await d.wait_idle(WAIT)
    assert turns.turns == [] and not d.holds("r")


async def test_a_leased_run_is_driven_as_is_without_a_new_lease() -> None:
    turns = Turns()
    d, _, _ = dispatcher(turns)
    run = pending_run("r")
    d.dispatch("r", claimed=run)
    await d.wait_idle(WAIT)
    assert turns.driven == [run] and turns.turns == []


async def test_a_run_leased_elsewhere_is_nudged_and_no_longer_fresh() -> None:
    turns = Turns(acquired=False, gated=False)
    d, nudged, _ = dispatcher(turns)
    d.mark_fresh("r")
    d.dispatch("r", nudge=True)
    await d.wait_idle(WAIT)
    assert nudged == ["r"]
    # Another process may have run turns of it: its history must be read after all.
    assert d.take_fresh("r") is False
    d.mark_fresh("s")
    assert d.take_fresh("s") is True and d.take_fresh("s") is False


async def test_runs_waiting_only_for_the_outside_hold_no_room() -> None:
    turns = Turns()
    idle: list[str] = []
    d, _, _ = dispatcher(turns, idle=idle)
    d.dispatch("r")
    await turns.next_start()
    assert d.load == 1
    idle.append("r")  # the body now waits for a signal or a timer only
    assert d.load == 0 and d.busy
    turns.end(0)
    await d.wait_idle(WAIT)


async def test_background_tasks_are_tracked_and_cancelled_at_close() -> None:
    d, _, _ = dispatcher(Turns())
    done = asyncio.Event()
    forever = asyncio.Event()

    async def quick() -> None:
        done.set()

    quick_task = d.spawn(quick())
    slow_task = d.spawn(forever.wait())
    await asyncio.wait_for(done.wait(), WAIT)
    await quick_task
    assert d.pending_tasks() == [slow_task]
    await d.cancel_tasks()
    assert slow_task.cancelled() and d.pending_tasks() == []
