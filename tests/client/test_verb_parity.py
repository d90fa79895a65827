"""`Client` and `Engine` answer the same verb under the same name with the same signature;
the engine's old names still work and warn, naming the new one."""

from __future__ import annotations

import inspect
import typing
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import durably
from tests.engine_support import RESULT_TIMEOUT, EngineFactory

# What only a process that runs the worker can do: its lifecycle (open, drain), its
# registry, observing its events, the updates its validators check, the events it fans out
# to `on_event` workflows, worker health as it sees itself, re-driving and polling by hand.
ENGINE_ONLY = {
    "open",
    "drain",
    "register",
    "registration",
    "register_queue",
    "registered_workflows",
    "unserved_on_error_routes",
    "update",
    "publish_event",
    "register_update_validator",
    "workflow_directory",
    "metrics",
    "queue_stats",
    "on_dead",
    "on_cancel",
    "resume",
    "run_pending",
    "recover_incomplete",
    "resume_due_timers",
    "sweep_timeouts",
    "wait_idle",
    "fire_schedules",  # firing schedules is what a driving engine does
}
# `Engine.subscribe` also has the all-events form (`subscribe(listener)`): the Client's
# `subscribe(run_id, listener)` is its other overload (checked below).
OVERLOADED = {"subscribe"}
# The engine's old names: each forwards to its new name with a DeprecationWarning.
DEPRECATED = {"requeue": "retry", "handle": "get_handle"}


def public_verbs(cls: type) -> dict[str, Callable[..., Any]]:
    """The public methods of `cls` (properties and attributes are not verbs)."""
    return {
        name: member
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def shape_of(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """A signature without annotations (the engine's `start` is typed by its own
    TypeVars): each parameter's name, kind and default."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_client_and_engine_have_the_same_verbs_with_the_same_signatures():
    client = public_verbs(durably.Client)
    engine = public_verbs(durably.Engine)
    shared = set(engine) - ENGINE_ONLY - set(DEPRECATED)
    assert set(client) == shared, (
        f"only on Client: {sorted(set(client) - shared)}; "
        f"only on Engine: {sorted(shared - set(client))}"
    )
    for name in sorted(shared - OVERLOADED):
        assert shape_of(client[name]) == shape_of(engine[name]), name
        # an async verb on one is async on the other
        assert inspect.iscoroutinefunction(client[name]) == inspect.iscoroutinefunction(
            engine[name]
        ), name
    assert ENGINE_ONLY <= set(engine)  # the list names real verbs, none of the Client's
    assert not ENGINE_ONLY & set(client)


def test_the_clients_subscribe_is_the_per_run_overload_of_the_engines():
    overloads = typing.get_overloads(durably.Engine.subscribe)
    assert [shape_of(o) for o in overloads][1] == shape_of(durably.Client.subscribe)
    assert inspect.iscoroutinefunction(durably.Client.subscribe)


def test_each_deprecated_alias_has_the_signature_of_its_new_name():
    engine = public_verbs(durably.Engine)
    for old, new in DEPRECATED.items():
        assert shape_of(engine[old]) == shape_of(engine[new]), old


async def test_each_deprecated_alias_warns_naming_the_new_name_and_still_works(
    engine_factory: EngineFactory, uid: str
):
    attempts: dict[str, int] = {}

    @durably.step(f"{uid}.flaky")
    async def flaky(x: int) -> int:
        attempts["n"] = attempts.get("n", 0) + 1
        if attempts["n"] == 1:
            raise durably.FatalError("first attempt fails")
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: durably.WorkflowCtx, x: int) -> int:
        return await ctx.step(flaky, x)

    async with engine_factory() as engine:
        handle = await engine.start(wf, 1, run_id=f"{uid}-r")
        with pytest.raises(durably.RunFailedError):
            await handle.result(timeout=RESULT_TIMEOUT)
        with pytest.warns(DeprecationWarning, match=r"Engine\.requeue .*use retry"):
            retried = await engine.requeue(handle.run_id)
        assert retried is not None
        with pytest.warns(DeprecationWarning, match=r"Engine\.handle .*use get_handle"):
            old = engine.handle(handle.run_id)
        assert await old.result(timeout=RESULT_TIMEOUT) == 2
        # the new names give no warning
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            assert await engine.get_handle(handle.run_id).result(timeout=RESULT_TIMEOUT) == 2
            assert await engine.result(handle.run_id, timeout=RESULT_TIMEOUT) == 2
            assert await engine.retry(f"{uid}-nope") is None


async def test_engine_signal_with_start_starts_once_and_delivers_every_signal(
    engine_factory: EngineFactory, uid: str
):
    @durably.workflow(f"{uid}.collect")
    async def collect(ctx: durably.WorkflowCtx) -> list[str]:
        first = await ctx.wait_for_signal(f"{uid}.go")
        second = await ctx.wait_for_signal(f"{uid}.go")
        return [first, second]

    async with engine_factory() as engine:
        h1 = await engine.signal_with_start(
            collect, run_id=f"{uid}-s", token=f"{uid}.go", payload="a"
        )
        h2 = await engine.signal_with_start(
            collect, run_id=f"{uid}-s", token=f"{uid}.go", payload="b"
        )
        assert h1.run_id == h2.run_id == f"{uid}-s"
        assert sorted(await engine.result(h1.run_id, timeout=RESULT_TIMEOUT)) == ["a", "b"]
