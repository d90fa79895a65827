"""An engine's role is one explicit option (`Engine(role="worker" | "control" | "both")`).

The defect this pins: an engine given `workflows=[]` and a transport silently became a pure
step worker and took no remote workflow decision, so a control plane serving only workflows
routed by convention to remote workers — configured the natural way — left every run
`suspended`. Here such a control plane, over real Redis with the published durable-worker SDK
holding the workflow's body, completes its runs; contradictory combinations are refused when
the engine is built; the role is logged at open.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

import durably
from durably.transports import InMemoryBroker, InMemoryTransport, RedisTransport
from tests.remote import redis_support
from tests.remote.test_remote_workflow_redis import sdk_worker

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(600)  # the first run may build the SDK's virtualenv


async def test_a_control_plane_with_no_workflows_completes_convention_routed_runs(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"role{os.getpid()}"
    engine = durably.Engine(
        f"sqlite:///{tmp_path / 'control.db'}",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[],  # every workflow it runs is served remotely, found by convention
        steps=[],
        timer_poll_ms=50,
    )
    with sdk_worker(redis_url, redis_prefix, tag):
        async with engine:
            handle = await engine.start(f"{tag}.order", {"amount": 40}, run_id=f"{tag}-ok")
            # Before roles, this run stayed `suspended`: no decision was ever taken.
            assert await handle.result(timeout=60) == {"receipt": {"charged": 40}, "at": True}
            run = await engine.get_run(f"{tag}-ok")
            assert run is not None and run.status == "completed"
    assert engine.role == "both"


async def test_an_explicit_control_plane_completes_them_too(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"rolec{os.getpid()}"
    engine = durably.Engine(
        f"sqlite:///{tmp_path / 'control.db'}",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[],
        role="control",
        timer_poll_ms=50,
    )
    with sdk_worker(redis_url, redis_prefix, tag):
        async with engine:
            handle = await engine.start(f"{tag}.order", {"amount": 7}, run_id=f"{tag}-ok")
            assert await handle.result(timeout=60) == {"receipt": {"charged": 7}, "at": True}


@durably.step("roles.inc")
async def inc(x: int) -> int:
    return x + 1


@durably.workflow("roles.twice")
async def twice(ctx: durably.WorkflowCtx, x: int) -> int:
    return int(await ctx.step(inc, x)) + int(await ctx.step(inc, x + 10))


async def test_a_step_worker_serves_steps_and_a_control_plane_takes_the_results() -> None:
    broker = InMemoryBroker()
    worker = durably.Engine(
        "memory", transport=InMemoryTransport(broker), role="worker", steps=[inc]
    )
    control = durably.Engine(
        "memory", transport=InMemoryTransport(broker), role="control", workflows=[twice]
    )
    assert worker.role == "worker" and not worker.drive_runs
    async with worker, control:
        assert await control.execute(twice, 1, timeout=20) == 2 + 12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"role": "workers"}, "must be 'worker' or 'control' or 'both'"),
        ({"role": "worker"}, "serves steps over a transport"),
        ({"role": "control"}, "hands every step to workers"),
        ({"role": "worker", "transport": True, "workflows": [twice]}, "could never run here"),
        ({"role": "control", "transport": True, "steps": [inc]}, "serves no step"),
        ({"transport": True, "workflows": []}, "say which role it has"),
    ],
)
def test_contradictory_roles_are_refused(kwargs: dict[str, object], message: str) -> None:
    if kwargs.pop("transport", False):
        kwargs["transport"] = InMemoryTransport()
    with pytest.raises(ValueError, match=message):
        durably.Engine("memory", **kwargs)  # type: ignore[arg-type]


def test_consistent_roles_are_accepted() -> None:
    t = InMemoryTransport
    # an observer: reads and starts runs, consumes nothing, serves nothing
    durably.Engine("memory", t(), role="worker", workflows=[twice], drive=False)
    durably.Engine("memory", t(), role="worker", workflows=[], steps=[inc])
    durably.Engine("memory", t(), role="control", steps=[])
    durably.Engine("memory", t(), role="both", workflows=[])
    durably.Engine("memory", workflows=[])  # no transport: everything runs here


def test_the_role_comes_from_the_environment_when_not_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DURABLY_ROLE", "worker")
    assert durably.Engine("memory", InMemoryTransport(), workflows=[]).role == "worker"
    assert durably.Engine("memory", InMemoryTransport(), role="both").role == "both"
    monkeypatch.setenv("DURABLY_ROLE", "boss")
    with pytest.raises(ValueError, match="DURABLY_ROLE must be"):
        durably.Engine("memory", InMemoryTransport())


async def test_the_role_is_logged_at_open(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="durably")
    engine = durably.Engine(
        "memory", InMemoryTransport(), role="worker", steps=[inc], namespace="billing"
    )
    async with engine:
        pass
    lines = [r for r in caplog.records if "role=" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    text = lines[0].getMessage()
    assert "role=worker" in text and "namespace=billing" in text
    assert "InMemoryTransport" in text and engine.instance_id in text


async def test_an_implicit_role_with_no_workflows_is_warned_about(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO, logger="durably")
    async with durably.Engine(
        f"sqlite:///{tmp_path / 'x.db'}", InMemoryTransport(), workflows=[]
    ) as engine:
        assert engine.role == "both"
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("must say role='worker'" in r.getMessage() for r in warned)
    info = [r.getMessage() for r in caplog.records if "role=" in r.getMessage()]
    assert any("role=both (the default)" in m for m in info)
