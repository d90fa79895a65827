"""An interpreter typed against `durably.DynamicWorkflowCtx` runs as a real workflow body
(memory and SQLite, resident and replay) and against a fake context, with the same result.

The graph exercises the name-addressed primitives: a step by name, a fan by name (one
member failing, seen as settled), a child workflow by name, a published event, a durable
sleep, a signal, and a patch marker."""

from __future__ import annotations

from typing import Any

import durably
from durably import WorkflowCtx
from tests.engine_support import RESULT_TIMEOUT, EngineFactory, wait_waiting_on
from tests.run.graph_interpreter import FakeCtx, interpret, is_dynamic


def graph(uid: str) -> list[dict[str, Any]]:
    return [
        {"op": "all", "name": f"{uid}.double"},
        {"op": "settled", "name": f"{uid}.positive"},
        {"op": "step", "name": f"{uid}.sum_known", "retries": 0},
        {"op": "child", "name": f"{uid}.inc"},
        {"op": "event", "key": "total"},
        {"op": "sleep", "seconds": 0.05},
        {"op": "signal", "token": f"{uid}.go"},
        {"op": "patched", "id": "p1"},
    ]


EXPECTED = [[7, "ok"], True]


def definitions(uid: str) -> tuple[list[Any], list[Any], dict[str, Any], dict[str, Any]]:
    @durably.step(f"{uid}.double")
    def double(x: int) -> int:
        return x * 2

    @durably.step(f"{uid}.positive", retries=0)
    def positive(x: int) -> int:
        if x < 0:
            raise durably.FatalError(f"{x} is negative", code="negative")
        return x

    @durably.step(f"{uid}.sum_known")
    def sum_known(xs: list[int | None]) -> int:
        return sum(x for x in xs if x is not None)

    @durably.workflow(f"{uid}.inc")
    async def inc(ctx: WorkflowCtx, x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.graph")
    async def run_graph(ctx: WorkflowCtx, spec: dict[str, Any]) -> Any:
        return await interpret(is_dynamic(ctx), spec["graph"], spec["value"])

    steps = {s.name: s for s in (double, positive, sum_known)}
    children = {inc.name: lambda x: x + 1}
    return [run_graph, inc], list(steps.values()), steps, children


async def test_an_interpreter_typed_against_the_protocol_runs_as_a_workflow_body(
    engine_factory: EngineFactory, uid: str
) -> None:
    workflows, steps, _, _ = definitions(uid)
    async with engine_factory(workflows=workflows, steps=steps) as engine:
        handle = await engine.start(
            f"{uid}.graph", {"graph": graph(uid), "value": [1, 2, -3]}, run_id=f"{uid}-g"
        )
        await wait_waiting_on(engine, handle.run_id, f"{uid}.go:{handle.run_id}")
        assert await engine.get_event(handle.run_id, "total") == 7
        await engine.signal(f"{uid}.go:{handle.run_id}", "ok")
        assert await handle.result(timeout=RESULT_TIMEOUT) == EXPECTED
        names = [cp.name for cp in await engine.list_checkpoints(handle.run_id)]
        assert f"{uid}.sum_known" in names and "sleep" in names and "patch:p1" in names


async def test_the_same_interpreter_runs_against_a_fake_context(uid: str) -> None:
    _, _, steps, children = definitions(uid)
    fake = FakeCtx(steps, children=children, signals={f"{uid}.go:fake-run": "ok"})
    assert await interpret(fake, graph(uid), [1, 2, -3]) == EXPECTED
    assert fake.events == {"total": 7}
    assert fake.calls == [
        (f"{uid}.double", 1),
        (f"{uid}.double", 2),
        (f"{uid}.double", -3),
        (f"{uid}.positive", 2),
        (f"{uid}.positive", 4),
        (f"{uid}.positive", -6),
        (f"{uid}.sum_known", [2, 4, None]),
        (f"child:{uid}.inc", 6),
        ("sleep", 0.05),
        ("signal", f"{uid}.go:fake-run"),
    ]
