"""`Poller` alone, with fake hosts and the in-memory store: it claims pending runs (by
priority, as far as there is room), recovers runs whose owner died, re-drives due timers,
and does nothing once draining."""

from __future__ import annotations

from typing import Any

from durably._core.models import WorkflowRun
from durably._engine.control.plane import ControlPlane
from durably._engine.control.signals import buffer_policy
from durably._engine.defs.options import EngineOptions
from durably._engine.worker.poller import Poller
from durably._store.memory import InMemoryStateStore

from .fakes import INSTANCE, Clock, Runs, Settle, pending_run


class Polled:
    def __init__(self, **options: Any) -> None:
        self.store = InMemoryStateStore()
        self.settle = Settle(self.store)
        self.runs = Runs()
        self.clock = Clock()
        self.dead: list[WorkflowRun] = []
        opts = EngineOptions(**options)
        policy = buffer_policy(opts)

        async def announce(kind: str, run_id: str) -> None:
            self.settle.wakes.announced.append((kind, run_id))

        plane = ControlPlane(
            self.store, clock=self.clock, signal_buffer=policy, announce=announce, namespace=None
        )
        self.poller = Poller(
            self.store,
            self.runs,
            settle=self.settle,
            plane=plane,
            options=opts,
            clock=self.clock,
            instance_id=INSTANCE,
            namespace=None,
            signal_buffer=policy,
            workflows=list,
            on_dead=self.dead.append,
        )

    async def row(self, run_id: str) -> WorkflowRun:
        run = await self.store.get_run(run_id)
        assert run is not None
        return run

    async def orphan(self, run_id: str, *, owner: str, until: int, **fields: Any) -> None:
        """A `running` run whose lease `owner` holds until `until`."""
        await self.store.create_run(pending_run(run_id, status="running", **fields))
        await self.store.update_run(run_id, {"locked_by": owner, "locked_until": until})


async def test_pending_runs_are_claimed_by_priority_as_far_as_there_is_room() -> None:
    p = Polled(max_concurrent_runs=2)
    await p.store.create_run(pending_run("low"))
    await p.store.create_run(pending_run("high", priority=5))
    await p.store.create_run(pending_run("mid", priority=1))
    assert await p.poller.run_pending() == 2
    assert [(run_id, claimed is not None) for run_id, claimed in p.runs.dispatched] == [
        ("high", True),
        ("mid", True),
    ]
    for run_id in ("high", "mid"):
        assert (await p.row(run_id)).locked_by == INSTANCE  # leased for the turn
    left = await p.row("low")
    assert (left.status, left.locked_by) == ("pending", None)
    assert p.poller.backlogged  # the end of a turn picks the rest up


async def test_runs_created_here_are_claimed_by_id_first() -> None:
    p = Polled()
    await p.store.create_run(pending_run("child"))
    p.poller.queue_claim("child")
    await p.poller.run_pending()
    [(run_id, claimed)] = p.runs.dispatched
    assert run_id == "child" and claimed is not None and claimed.locked_by == INSTANCE


async def test_a_dead_owners_run_is_recovered_and_a_live_ones_left_alone() -> None:
    p = Polled()
    now = p.clock()
    await p.orphan("orphan", owner="crashed", until=now - 1)
    await p.orphan("owned", owner="alive", until=now + 10_000)
    assert await p.poller.recover_incomplete() == 1
    orphan = await p.row("orphan")
    assert (orphan.status, orphan.recovery_attempts, orphan.locked_by) == ("pending", 1, None)
    assert [run_id for run_id, _ in p.runs.dispatched] == ["orphan"]
    owned = await p.row("owned")
    assert (owned.status, owned.locked_by, owned.recovery_attempts) == ("running", "alive", None)


async def test_a_run_past_its_recovery_attempts_is_dead_lettered() -> None:
    p = Polled(max_recovery_attempts=2)
    await p.orphan("poison", owner="crashed", until=p.clock() - 1, recovery_attempts=2)
    assert await p.poller.recover_incomplete() == 0
    run = await p.row("poison")
    assert run.status == "dead" and run.error is not None
    assert run.error.code == "max_recovery_attempts"
    assert [d.id for d in p.dead] == ["poison"] and p.runs.dispatched == []
    assert p.settle.events.types("poison") == ["run.failed"]


async def test_due_timers_are_re_driven() -> None:
    p = Polled()
    now = p.clock()
    await p.store.create_run(pending_run("due", status="suspended", wake_at=now - 1))
    await p.store.create_run(pending_run("later", status="suspended", wake_at=now + 60_000))
    assert await p.poller.resume_due_timers() == 1
    assert [run_id for run_id, _ in p.runs.dispatched] == ["due"]


async def test_a_draining_poller_takes_nothing() -> None:
    p = Polled()
    now = p.clock()
    await p.store.create_run(pending_run("new"))
    await p.orphan("orphan", owner="crashed", until=now - 1)
    await p.store.create_run(pending_run("due", status="suspended", wake_at=now - 1))
    p.runs.begin_drain()
    await p.poller.poll_once()
    assert await p.poller.run_pending() == 0
    assert p.runs.dispatched == []
    assert (await p.row("new")).locked_by is None
    assert (await p.row("orphan")).locked_by == "crashed"
