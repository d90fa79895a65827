"""Options the API declares but durably does not implement yet are refused where they are
given, with an error naming the feature; options that are implemented are not refused.

Each refusal here pins an option that used to be accepted and then ignored (or to fail with
an error that named no feature). When a feature is implemented, its refusal test goes.
"""

from __future__ import annotations

import re
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import EngineEvent, InMemoryStateStore, RunFailedError, WorkflowCtx
from durably.transports import InMemoryTransport
from tests.engine_support import RESULT_TIMEOUT, EngineFactory, shape

ROOT = Path(__file__).resolve().parents[2]

PRIORITY = r"step priority is not supported yet"


def memory_engine(**options: Any) -> durably.Engine:
    return durably.Engine(store=InMemoryStateStore(), **options)


# ------------------------------------------------------------------ step priority
# A run's priority is implemented (tests/worker/test_priority.py); a step's orders nothing yet.


async def test_ctx_calls_refuse_step_priority_and_queue_at_the_call(
    engine_factory: EngineFactory, uid: str
) -> None:
    """The error comes out of the ctx call itself, before any position is claimed: a body
    that catches it goes on with the same history numbering as one that never tried. A
    child's or a workflow fan's priority is the child runs' and is accepted."""

    @durably.step(f"{uid}.inc")
    def inc(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> dict[str, Any]:
        refused: dict[str, str] = {}
        attempts: dict[str, Any] = {
            "step.priority": lambda: ctx.step(inc, 1, priority=1),
            "all.priority": lambda: ctx.all(inc, [1, 2], priority=1),
            "all_settled.priority": lambda: ctx.all_settled(inc, [1, 2], priority=1),
        }
        for label, attempt in attempts.items():
            try:
                attempt()
            except NotImplementedError as exc:
                refused[label] = str(exc)
        out = await ctx.step(inc, 1, priority=None, queue=None)
        kid = await ctx.child(child, 7, priority=3)  # a run priority: accepted
        return {"refused": refused, "out": out, "kid": kid}

    async with engine_factory() as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        result = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)
        child_run = await engine.get_run(f"{uid}-r.child.1")

    refused = result["refused"]
    assert sorted(refused) == sorted(
        [
            "step.priority",
            "all.priority",
            "all_settled.priority",
        ]
    )
    for label in refused:
        primitive = label.split(".")[0]
        assert refused[label].startswith(f"ctx.{primitive}: "), refused[label]
        assert re.search(PRIORITY, refused[label]), refused[label]
    assert result["out"] == 2 and result["kid"] == 7
    assert shape(cps)[0] == (0, f"{uid}.inc", "remote", "completed")
    assert child_run is not None and child_run.priority == 3


# ------------------------------------------------------------------ decorators


def test_step_decorators_take_no_queue() -> None:
    """A queue belongs to the call (`ctx.step(queue=)`), never to the step."""
    with pytest.raises(TypeError, match="queue"):
        durably.step("x", queue="payments")  # type: ignore[call-arg]


# ------------------------------------------------------------------ Engine(...)


@pytest.mark.parametrize(
    ("option", "feature"),
    [
        ("topology", "topology roles are given as role="),
        ("partition", "serving partitions are not supported yet"),
    ],
)
def test_engine_options_of_missing_features_name_the_feature(option: str, feature: str) -> None:
    with pytest.raises(NotImplementedError) as info:
        memory_engine(**{option: object()})
    assert str(info.value).startswith(f"Engine({option}=...): {feature}"), str(info.value)


def test_worker_concurrency_with_a_transport_is_refused_by_name() -> None:
    transport = InMemoryTransport()
    for spec in (4, "adaptive"):
        with pytest.raises(NotImplementedError) as info:
            durably.Engine(InMemoryStateStore(), transport, concurrency=spec)
        assert str(info.value).startswith(
            "Engine(concurrency=...): worker concurrency over a transport is not supported yet"
        ), str(info.value)


def test_a_transport_url_of_an_unsupported_broker_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"transport 'amqp://localhost': unknown scheme 'amqp'"):
        durably.Engine(InMemoryStateStore(), "amqp://localhost")


def test_the_transport_options_of_other_engines_point_to_transport() -> None:
    for name in ("transports", "connection"):
        with pytest.raises(TypeError, match=rf"{name} \(did you mean transport\?\)"):
            memory_engine(**{name: []})


def test_a_misspelt_engine_option_is_a_type_error_with_a_suggestion() -> None:
    with pytest.raises(TypeError, match=r"lease_msx \(did you mean lease_ms\?\)"):
        memory_engine(lease_msx=1)
    with pytest.raises(TypeError, match=r"shutdown_timeout_ms \(did you mean drain_timeout_ms"):
        memory_engine(shutdown_timeout_ms=1)
    with pytest.raises(TypeError, match="unknown Engine option"):
        memory_engine(completely_unrelated=1)


# ------------------------------------------------------------------ events and extras


def test_blocked_and_unrouted_runs_are_declared_and_counted() -> None:
    declared = set(typing.get_args(typing.get_type_hints(EngineEvent)["type"]))
    assert {"run.blocked", "run.unrouted", "run.routed"} <= declared
    assert {"reason", "requires", "diagnostics"} <= set(EngineEvent.__dataclass_fields__)
    snapshot = memory_engine().metrics()
    assert snapshot.runs["blocked"] == 0 and snapshot.runs["unrouted"] == 0


def test_every_optional_extra_is_asked_for_by_the_code_that_needs_it() -> None:
    """An extra is only honest when some code needs its packages, and such code tells a user
    without them what to install (`pip install 'durably[postgres]'`). An extra nothing asks
    for installs dead weight and promises a feature that does not exist."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    source = "\n".join(
        path.read_text(encoding="utf-8") for path in (ROOT / "src" / "durably").rglob("*.py")
    )
    # `dev` and `docs` are the project's own working extras (the suite, the site build), not
    # features of the library a user installs.
    extras = set(project["optional-dependencies"]) - {"dev", "docs"}
    assert {"postgres", "dashboard", "crypto"} <= extras
    assert sorted(e for e in extras if f"durably[{e}]" not in source) == []


# ------------------------------------------------------------------ implemented options


async def test_declared_options_that_work_are_not_refused(
    engine_factory: EngineFactory, uid: str
) -> None:
    """The audit's other half: `on_event` starts a run and a `search_attributes` schema
    rejects a bad upsert, so neither is a silent no-op."""

    @durably.workflow(f"{uid}.on-event", on_event=[f"{uid}.paid"])
    async def on_paid(ctx: WorkflowCtx, payload: dict[str, Any]) -> int:
        return int(payload["amount"])

    def schema(attrs: dict[str, Any]) -> str | None:
        return None if isinstance(attrs.get("tier"), str) else "tier must be a string"

    @durably.workflow(f"{uid}.attrs", search_attributes=schema)
    async def attrs(ctx: WorkflowCtx) -> None:
        await ctx.upsert_search_attributes({"tier": 3})

    async with engine_factory(workflows=[on_paid, attrs]) as engine:
        touched = await engine.publish_event(f"{uid}.paid", {"amount": 7}, id=f"{uid}-e")
        started = engine.get_handle(f"evt:{uid}-e:{uid}.on-event")
        assert await started.result(timeout=RESULT_TIMEOUT) == 7
        handle = await engine.start(attrs, run_id=f"{uid}-a")
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
    assert touched == 1
    assert info.value.error is not None and info.value.error.code == "invalid_search_attributes"
