"""The worker's host roles alone: the control plane's local hooks drive a run created here
only while there is room (else it waits in the backlog), and settling tells `on_cancel`
listeners even when one of them raises."""

from __future__ import annotations

from typing import Any

from durably._core.models import StepCheckpoint, StepError, WorkflowRun
from durably._engine.defs.registry import Registry
from durably._engine.worker.hosts import Listeners, LocalHooks, Registrations, Settling
from durably._store.memory import InMemoryStateStore

from .fakes import Events, Runs, Wakes, pending_run


class Deliveries:
    def __init__(self) -> None:
        self.redriven: list[str] = []
        self.parents: list[str] = []

    async def redrive(self, run_id: str, cp: StepCheckpoint | None = None) -> None:
        self.redriven.append(run_id)

    def notify_parent(self, run: WorkflowRun | str, completion: dict[str, Any]) -> None:
        self.parents.append(run if isinstance(run, str) else run.id)


def hooks(runs: Runs, *, room: int = 2) -> tuple[LocalHooks, Wakes, Events, list[str]]:
    wakes, events, told = Wakes(), Events(), Listeners[str]("on_cancel")
    cancelled: list[str] = []
    told.add(cancelled.append)
    local = LocalHooks(
        runs,
        Registrations(Registry(), None),
        wakes,
        Deliveries(),
        events,
        told,
        max_concurrent_runs=room,
        fleet=None,
    )
    return local, wakes, events, cancelled


async def test_a_run_created_here_runs_at_once_while_there_is_room() -> None:
    runs = Runs()
    local, wakes, _, _ = hooks(runs, room=1)
    await local.run_created("a")
    assert [run_id for run_id, _ in runs.dispatched] == ["a"] and runs.take_fresh("a")
    # Full: the next one waits in the pending backlog; a pick-up is asked for instead.
    await local.run_created("b")
    assert [run_id for run_id, _ in runs.dispatched] == ["a"] and wakes.kicks == 1


async def test_a_process_that_does_not_drive_announces_the_run() -> None:
    runs = Runs(drive_runs=False)
    local, wakes, _, _ = hooks(runs)
    await local.run_created("a")
    assert runs.dispatched == [] and wakes.announced == [("ready", "a")]


async def test_a_cancel_is_told_to_its_listeners_and_as_an_event() -> None:
    runs = Runs()
    local, _, events, cancelled = hooks(runs)
    local.run_cancelled(pending_run("r"), StepError(message="cancelled", code="cancelled"))
    assert cancelled == ["r"] and events.types("r") == ["run.failed"]
    assert local.request_cancel("r") is False  # no turn of it executes here


def test_a_listener_that_raises_does_not_stop_the_others() -> None:
    told = Listeners[str]("on_cancel")
    heard: list[str] = []

    def broken(run_id: str) -> None:
        raise RuntimeError("listener bug")

    told.add(broken)
    remove = told.add(heard.append)
    settling = Settling(InMemoryStateStore(), Events(), Wakes(), Deliveries(), told)
    settling.fire_cancel("r")
    remove()
    settling.fire_cancel("s")
    assert heard == ["r"]
