"""Capability routing inside one process, on a real SQLite file store: the rules are the ones
Redis follows (tests/remote/test_capability_routing_redis.py).

- Over `InMemoryTransport` a step that requires `gpu` is dispatched only while some engine
  serving it on the broker declares `gpu`; with none, the run is parked `blocked` with the
  reason naming the capability (and the workers it saw), and re-checked until one appears.
- Without a transport an engine runs its steps in-process, so a step that requires `gpu` runs
  there when the engine itself declares `gpu`; otherwise the run is parked `blocked` likewise,
  and another engine on the same store that declares it takes the run on its re-check.
- A wait on a blocked run that times out says why the run is blocked.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import EngineEvent, WorkflowCtx
from durably.transports import InMemoryBroker, InMemoryTransport
from tests.engine_support import FAST_TUNING

RESULT_TIMEOUT = 20.0


def _gpu_workflow(uid: str, served_by: list[str]) -> tuple[Any, Any]:
    @durably.step(f"{uid}.render", requires=["gpu"])
    async def render(x: int) -> int:
        served_by.append("render")
        return x * 10

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(render, x)

    return render, wf


def _db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'durably.db'}"


async def test_an_engine_serving_its_own_steps_runs_a_step_its_capabilities_cover(
    tmp_path: Path, uid: str
) -> None:
    served_by: list[str] = []
    render, wf = _gpu_workflow(uid, served_by)
    engine = durably.Engine(
        _db(tmp_path),
        transport=InMemoryTransport(),
        workflows=[wf],
        steps=[render],
        capabilities=["gpu"],
        **FAST_TUNING,
    )
    async with engine:
        assert await engine.execute(wf, 4, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 40
    assert served_by == ["render"]


async def test_the_in_memory_transport_routes_only_to_a_worker_with_the_capability(
    tmp_path: Path, uid: str
) -> None:
    served_by: list[str] = []
    render, wf = _gpu_workflow(uid, served_by)
    broker = InMemoryBroker()

    def worker(capabilities: list[str]) -> durably.Engine:
        # A pure step worker on its own store, on the same broker: it serves `render` only.
        return durably.Engine(
            "memory",
            transport=InMemoryTransport(broker),
            role="worker",
            steps=[render],
            capabilities=capabilities,
        )

    events: list[EngineEvent] = []
    engine = durably.Engine(
        _db(tmp_path),
        transport=InMemoryTransport(broker),
        workflows=[wf],
        steps=[],
        **FAST_TUNING,
    )
    async with engine:
        engine.subscribe(events.append)
        async with worker(["cpu"]):
            # A live worker serves the step, but without `gpu`: nothing is dispatched.
            handle = await engine.start(wf, 4, run_id=f"{uid}-r")
            run = await handle.wait(timeout=RESULT_TIMEOUT)
            assert run.status == "blocked"
            assert run.error is not None and run.error.code == "capability.unavailable"
            assert "requires gpu" in run.error.message
            assert run.wake_at is not None  # re-checked, not abandoned
            assert broker.dispatched == []
        blocked = [e for e in events if e.type == "run.blocked"]
        assert blocked and blocked[0].requires == ("gpu",)
        diagnostics = blocked[0].diagnostics
        assert isinstance(diagnostics, dict)
        assert diagnostics["liveWorkers"] == 1
        assert diagnostics["missingCapabilities"] == ["gpu"]

        async with worker(["gpu", "cuda"]):
            # The next re-check finds the worker, and the step goes to it.
            assert await handle.result(timeout=RESULT_TIMEOUT) == 40
    assert served_by == ["render"]
    assert [t.name for t in broker.dispatched] == [f"{uid}.render"]


async def test_with_no_engine_offering_the_capability_a_wait_says_why(
    tmp_path: Path, uid: str
) -> None:
    served_by: list[str] = []
    render, wf = _gpu_workflow(uid, served_by)
    engine = durably.Engine(
        _db(tmp_path),
        transport=InMemoryTransport(),
        workflows=[wf],
        steps=[render],  # served here, but this engine declares no capability
        **FAST_TUNING,
    )
    async with engine:
        handle = await engine.start(wf, 4, run_id=f"{uid}-r")
        run = await handle.wait(timeout=RESULT_TIMEOUT)
        assert run.status == "blocked"
        assert run.error is not None and "requires gpu" in run.error.message
        # `result` waits for a terminal state, which a blocked run does not reach on its own:
        # its timeout says why.
        with pytest.raises(TimeoutError, match=r"blocked: no compatible worker \(requires gpu\)"):
            await handle.result(timeout=0.2)
    assert served_by == []


async def test_an_engine_without_transport_runs_a_step_its_capabilities_cover(
    tmp_path: Path, uid: str
) -> None:
    served_by: list[str] = []
    render, wf = _gpu_workflow(uid, served_by)
    engine = durably.Engine(
        _db(tmp_path), workflows=[wf], steps=[render], capabilities=["gpu"], **FAST_TUNING
    )
    async with engine:
        assert await engine.execute(wf, 4, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 40
    assert served_by == ["render"]


async def test_a_blocked_run_is_taken_by_an_engine_on_the_store_that_declares_the_capability(
    tmp_path: Path, uid: str
) -> None:
    served_by: list[str] = []
    render, wf = _gpu_workflow(uid, served_by)
    plain = durably.Engine(_db(tmp_path), workflows=[wf], steps=[render], **FAST_TUNING)
    async with plain:
        handle = await plain.start(wf, 4, run_id=f"{uid}-r")
        run = await handle.wait(timeout=RESULT_TIMEOUT)
        assert run.status == "blocked"
        assert run.error is not None and "requires gpu" in run.error.message
    assert served_by == []
    gpu = durably.Engine(
        _db(tmp_path), workflows=[wf], steps=[render], capabilities=["gpu"], **FAST_TUNING
    )
    async with gpu:
        assert await gpu.get_handle(f"{uid}-r").result(timeout=RESULT_TIMEOUT) == 40
    assert served_by == ["render"]


async def test_worker_health_lists_the_step_servers_on_an_in_memory_broker(
    tmp_path: Path, uid: str
) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    @durably.step(f"{uid}.slow", requires=["gpu"])
    async def slow(x: int) -> int:
        started.set()
        await release.wait()
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(slow, x)

    broker = InMemoryBroker()
    worker = durably.Engine(
        "memory",
        transport=InMemoryTransport(broker),
        role="worker",
        steps=[slow],
        capabilities=["gpu"],
        instance_id=f"{uid}-gpu",
        step_threads=2,
    )
    engine = durably.Engine(
        _db(tmp_path), transport=InMemoryTransport(broker), workflows=[wf], steps=[], **FAST_TUNING
    )
    token = f"{uid}.slow"
    async with worker, engine:
        handle = await engine.start(wf, 7, run_id=f"{uid}-r")
        await asyncio.wait_for(started.wait(), RESULT_TIMEOUT)
        groups = {g.group: g for g in await engine.worker_health()}
        group = groups[token]
        assert (group.kind, group.depth) == ("step", 1)  # the task being served
        [live] = group.live_workers
        assert live.instance_id == f"{uid}-gpu"
        assert live.status is not None and live.status.in_flight == 1
        assert live.status.concurrency.limit == 2
        assert live.descriptor is not None and live.descriptor.capabilities == ("gpu",)
        assert live.descriptor.steps == (token,)
        release.set()
        assert await handle.result(timeout=RESULT_TIMEOUT) == 7
    # Drained with its engine: the broker lists nobody any more.
    assert await broker.list_worker_groups() == set()
