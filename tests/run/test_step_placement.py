"""Step events say where the step ran (`EngineEvent.placement`), while `kind` keeps the
stored kind of the step's row (an in-process `ctx.step` is written as a `remote` row)."""

from __future__ import annotations

import durably
from durably import EngineEvent, WorkflowCtx
from durably._core.models import WorkflowRun
from durably._engine.remote.turn_commands import step_event
from durably.transports import InMemoryTransport
from tests.engine_support import EngineFactory, EventLog
from tests.read.builders import T0, step

TIMEOUT = 20


def _steps(log: EventLog, run_id: str) -> list[tuple[str, str | None, str | None, str | None]]:
    return [
        (e.type, e.name, e.kind, e.placement)
        for e in log.of(run_id, "step.started", "step.completed", "step.failed")
    ]


async def test_in_process_steps_say_in_process(engine_factory: EngineFactory, uid: str) -> None:
    tries: list[int] = []

    @durably.step(f"{uid}.double", retries=2)
    def double(x: int) -> int:
        tries.append(x)
        if len(tries) == 1:
            raise RuntimeError("first attempt fails")
        return x * 2

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        doubled = await ctx.step(double, x)
        return await ctx.local_step("inc", lambda log: doubled + 1)

    async with engine_factory(workflows=[wf]) as engine:
        log = EventLog(engine)
        assert await engine.execute(wf, 5, run_id=f"{uid}-r", timeout=TIMEOUT) == 11
    seen = _steps(log, f"{uid}-r")
    name = f"{uid}.double"
    # `kind` is the row's kind as before; `placement` is where it ran.
    assert seen == [
        ("step.started", name, "remote", "in_process"),
        ("step.failed", name, "remote", "in_process"),
        ("step.started", name, "remote", "in_process"),
        ("step.completed", name, "remote", "in_process"),
        ("step.started", "inc", "local", "in_process"),
        ("step.completed", "inc", "local", "in_process"),
    ]
    # Run events carry none.
    assert {e.placement for e in log.of(f"{uid}-r", "run.started", "run.completed")} == {None}


async def test_steps_over_a_transport_say_remote(engine_factory: EngineFactory, uid: str) -> None:
    @durably.step(f"{uid}:double")
    async def double(x: int) -> int:
        return x * 2

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(double, x)

    async with engine_factory(transport=InMemoryTransport(), steps=[double]) as engine:
        log = EventLog(engine)
        assert await engine.execute(wf, 5, run_id=f"{uid}-r", timeout=TIMEOUT) == 10
    assert _steps(log, f"{uid}-r") == [
        ("step.started", f"{uid}:double", "remote", "remote"),
        ("step.completed", f"{uid}:double", "remote", "remote"),
    ]


def test_placement_in_the_json_form() -> None:
    event = EngineEvent(type="step.started", run_id="r", kind="remote", placement="in_process")
    body = event.to_json()
    assert (body["kind"], body["placement"]) == ("remote", "in_process")
    assert EngineEvent.from_json(body).placement == "in_process"
    # An event from an engine that does not write it reads as unknown, not as a guess.
    assert "placement" not in EngineEvent(type="run.started", run_id="r").to_json()
    del body["placement"]
    assert EngineEvent.from_json(body).placement is None


def test_a_remote_workflow_turns_rows_say_remote() -> None:
    # The rows a remote workflow worker's turn writes (a step it ran, a call it dispatched)
    # ran away from the engine that emits their events.
    run = WorkflowRun(
        id="r", workflow="w", workflow_version="1", status="running", created_at=T0, updated_at=T0
    )
    for status in ("pending", "completed", "failed"):
        for kind in ("local", "remote"):
            event = step_event(run, step(0, "s", status=status, kind=kind), kind)
            assert (event.kind, event.placement) == (kind, "remote"), event
