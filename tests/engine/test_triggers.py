"""Event triggers end to end: `on_event` starts (with equality and predicate matches), and
the `debounce=` / `batch=` accumulators, on every store and in both execution modes.

The accumulators are built-in workflows that take stored events when a signal wakes them;
the crash half of their promise (kill -9 between the events and the flush) is
tests/faults/test_trigger_faults.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durably
from durably import Batch, EventTrigger, RunQuery, WorkflowCtx, WorkflowRun
from durably._core.triggers import ACCUMULATOR_PREFIX, BATCH_WORKFLOW, DEBOUNCE_WORKFLOW
from durably._engine import triggers

from .conftest import EngineFactory
from .support import RESULT_TIMEOUT, wait_until

WINDOW = "300ms"


async def completed_runs(engine: durably.Engine, workflow: str, n: int) -> list[WorkflowRun]:
    """Wait until `workflow` has `n` completed runs; returns them oldest first (and checks
    no other run of it exists)."""
    found: list[WorkflowRun] = []

    async def check() -> bool:
        runs = await engine.store.list_runs(RunQuery(workflow=workflow))
        found[:] = [r for r in runs if r.status == "completed"]
        return len(found) >= n

    await wait_until(check, timeout=RESULT_TIMEOUT)
    runs = await engine.store.list_runs(RunQuery(workflow=workflow))
    assert len(runs) == n, [(r.id, r.status, r.input) for r in runs]
    return sorted(found, key=lambda r: (r.created_at, r.id))


def echo(uid: str, name: str, **options: Any) -> durably.Workflow[Any, Any]:
    @durably.workflow(f"{uid}.{name}", **options)
    async def body(ctx: WorkflowCtx, payload: Any) -> Any:
        return payload

    return body


# ------------------------------------------------------------------ on_event


async def test_on_event_starts_each_matching_subscriber_once_per_event_id(
    engine_factory: EngineFactory, uid: str
) -> None:
    paid = f"{uid}.paid"
    plain = echo(uid, "plain", on_event=[paid])
    big = echo(uid, "big", on_event=[EventTrigger(paid, match=lambda p: p["amount"] >= 100)])
    eur = echo(uid, "eur", on_event=[EventTrigger(paid, match={"currency": "EUR"})])
    async with engine_factory(workflows=[plain, big, eur]) as engine:
        assert await engine.publish_event(paid, {"amount": 5, "currency": "EUR"}, id="e1") == 2
        assert await engine.publish_event(paid, {"amount": 500, "currency": "USD"}, id="e2") == 2
        # the same event id again starts nothing new (each start is idempotent by its id)
        assert await engine.publish_event(paid, {"amount": 5, "currency": "EUR"}, id="e1") == 2
        assert (await engine.handle(f"evt:e1:{uid}.eur").result(timeout=RESULT_TIMEOUT))[
            "amount"
        ] == 5
        plain_runs = await completed_runs(engine, plain.name, 2)
        big_runs = await completed_runs(engine, big.name, 1)
        eur_runs = await completed_runs(engine, eur.name, 1)
    assert sorted(r.id for r in plain_runs) == [f"evt:e1:{uid}.plain", f"evt:e2:{uid}.plain"]
    assert big_runs[0].output == {"amount": 500, "currency": "USD"}
    assert eur_runs[0].id == f"evt:e1:{uid}.eur"


async def test_a_predicate_that_raises_or_a_refused_input_skips_only_that_subscriber(
    engine_factory: EngineFactory, uid: str
) -> None:
    name = f"{uid}.evt"

    def boom(payload: Any) -> bool:
        raise KeyError("nope")

    @durably.workflow(f"{uid}.typed", on_event=[name])
    async def typed(ctx: WorkflowCtx, n: int) -> int:
        return n

    broken = echo(uid, "broken", on_event=[EventTrigger(name, match=boom)])
    fine = echo(uid, "fine", on_event=[name])
    async with engine_factory(workflows=[typed, broken, fine]) as engine:
        assert await engine.publish_event(name, {"not": "an int"}, id="x") == 1
        await completed_runs(engine, fine.name, 1)
        assert await engine.store.list_runs(RunQuery(workflow=typed.name)) == []
        assert await engine.store.list_runs(RunQuery(workflow=broken.name)) == []


# ------------------------------------------------------------------ debounce


async def test_debounce_starts_the_target_once_with_the_last_payload_per_quiet_period(
    engine_factory: EngineFactory, uid: str
) -> None:
    a, b = f"{uid}.a", f"{uid}.b"
    target = echo(uid, "debounced", on_event=[a, b], debounce=WINDOW)
    async with engine_factory(workflows=[target]) as engine:
        for i in range(5):  # two event names feed one accumulator
            assert await engine.publish_event(a if i % 2 else b, {"i": i}) == 1
        first = await completed_runs(engine, target.name, 1)
        assert first[0].output == {"i": 4}
        await engine.publish_event(a, {"i": 5})
        both = await completed_runs(engine, target.name, 2)
        assert both[1].output == {"i": 5}
        head = f"{ACCUMULATOR_PREFIX}{target.name}"
        ids: dict[str, str] = {}

        async def handed_over() -> bool:
            chain = await engine.store.list_runs(RunQuery(workflow=DEBOUNCE_WORKFLOW))
            ids.clear()
            ids.update({r.id: r.status for r in chain})
            return ids.get(f"{head}~1") == "completed" and f"{head}~2" in ids

        await wait_until(handed_over)
    # one accumulator run per delivery, each handing over to the next (which may not have
    # reached its wait yet)
    assert ids.pop(f"{head}~2") in ("pending", "running", "suspended")
    assert ids == {head: "completed", f"{head}~1": "completed"}
    assert all(r.id.startswith("evt:") and r.id.endswith(f":{target.name}") for r in both)


async def test_a_long_burst_hands_over_to_the_next_accumulator_run(
    engine_factory: EngineFactory, uid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After FOLD_LIMIT events one accumulator run hands what it holds to its successor, so
    no history grows without bound; the delivery is the same."""
    monkeypatch.setattr(triggers, "FOLD_LIMIT", 2)
    name = f"{uid}.evt"
    debounced = echo(uid, "debounced", on_event=[name], debounce="500ms")
    batched = echo(uid, "batched", on_event=[name], batch=Batch(max_size=7, within="2s"))
    async with engine_factory(workflows=[debounced, batched]) as engine:
        for i in range(7):
            assert await engine.publish_event(name, i) == 2
            await asyncio.sleep(0.05)
        [last] = await completed_runs(engine, debounced.name, 1)
        [batch] = await completed_runs(engine, batched.name, 1)
        chain = await engine.store.list_runs(RunQuery(workflow=DEBOUNCE_WORKFLOW))
    assert last.output == 6
    assert batch.output == {"events": list(range(7))}
    assert len(chain) >= 3  # handed over at least twice before the quiet period


# ------------------------------------------------------------------ batch


async def test_batch_delivers_max_size_events_in_publish_order_then_the_rest_at_the_window(
    engine_factory: EngineFactory, uid: str
) -> None:
    name = f"{uid}.evt"
    target = echo(uid, "batched", on_event=[name], batch=Batch(max_size=3, within="400ms"))
    async with engine_factory(workflows=[target]) as engine:
        for i in range(5):
            assert await engine.publish_event(name, {"n": i}) == 1
        runs = await completed_runs(engine, target.name, 2)

        async def chain_of_three() -> bool:
            chain = await engine.store.list_runs(RunQuery(workflow=BATCH_WORKFLOW))
            return len(chain) == 3  # two deliveries, and the run waiting for the next event

        await wait_until(chain_of_three)
    assert runs[0].output == {"events": [{"n": 0}, {"n": 1}, {"n": 2}]}
    assert runs[1].output == {"events": [{"n": 3}, {"n": 4}]}


async def test_batch_input_is_validated_as_events_and_a_refused_batch_does_not_stop_the_chain(
    engine_factory: EngineFactory, uid: str
) -> None:
    name = f"{uid}.evt"

    @durably.workflow(f"{uid}.sum", on_event=[name], batch=Batch(max_size=2, within="5s"))
    async def total(ctx: WorkflowCtx, batch: dict[str, list[int]]) -> int:
        return sum(batch["events"])

    async with engine_factory(workflows=[total]) as engine:
        await engine.publish_event(name, "not a number")
        await engine.publish_event(name, 1)  # this batch is refused by the target's input
        await engine.publish_event(name, 2)
        await engine.publish_event(name, 3)
        [run] = await completed_runs(engine, total.name, 1)
        chain = await engine.store.list_runs(RunQuery(workflow=BATCH_WORKFLOW))
    assert run.output == 5
    first = next(r for r in chain if r.id == f"{ACCUMULATOR_PREFIX}{total.name}")
    assert first.status == "completed" and first.output is not None
    assert first.output["started"] is None and "invalid input" in first.output["error"]


# ------------------------------------------------------------------ what is refused


def test_debounce_and_batch_are_checked_at_declaration(uid: str) -> None:
    with pytest.raises(ValueError, match="mutually exclusive"):
        durably.workflow(f"{uid}.a", on_event=["e"], debounce="1s", batch=Batch(2, "1s"))
    with pytest.raises(ValueError, match=r"debounce= needs on_event"):
        durably.workflow(f"{uid}.b", debounce="1s")
    with pytest.raises(ValueError, match="positive duration"):
        durably.workflow(f"{uid}.c", on_event=["e"], debounce=0)
    with pytest.raises(ValueError, match="max_size"):
        durably.workflow(f"{uid}.d", on_event=["e"], batch=Batch(0, "1s"))
    with pytest.raises(TypeError, match=r"durably\.Batch"):
        durably.workflow(f"{uid}.e", on_event=["e"], batch={"max_size": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        durably.workflow(f"{uid}.f", on_event=["e"], batch=Batch(2, 1), event_batch=Batch(2, 1))
    with pytest.raises(TypeError, match="EventTrigger"):
        durably.workflow(f"{uid}.g", on_event=[42])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not the str"):
        durably.workflow(f"{uid}.h", on_event="e")
    with pytest.raises(TypeError, match="mapping or a callable"):
        EventTrigger("e", match=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reserved for the engine"):
        durably.workflow("__mine")
    # `event_batch=` (the API's other name) is the same option
    wf = durably.workflow(f"{uid}.i", on_event=["e"], event_batch=Batch(2, "1s"))
    assert wf is not None


def test_engine_level_debounce_points_at_the_workflow_option() -> None:
    for option in ("debounce", "batch", "event_batch"):
        with pytest.raises(TypeError, match=r"did you mean @durably\.workflow"):
            durably.Engine(store=durably.InMemoryStateStore(), **{option: "1s"})


async def test_the_accumulators_cannot_be_started_or_signalled_from_outside(
    engine_factory: EngineFactory, uid: str
) -> None:
    name = f"{uid}.evt"
    target = echo(uid, "debounced", on_event=[name], debounce="10s")
    async with engine_factory(workflows=[target]) as engine:
        assert engine.registration(DEBOUNCE_WORKFLOW) is not None
        for workflow in (DEBOUNCE_WORKFLOW, BATCH_WORKFLOW):
            with pytest.raises(ValueError, match="belongs to the engine"):
                await engine.start(workflow, {"target": target.name, "windowMs": 1})
        with pytest.raises(ValueError, match="reserved for the engine's event accumulators"):
            await engine.start(target, 1, run_id=f"{ACCUMULATOR_PREFIX}{target.name}")
        with pytest.raises(durably.ReservedTokenError, match="event accumulator"):
            await engine.signal(f"{ACCUMULATOR_PREFIX}{target.name}", 1)
        with pytest.raises(ValueError, match="reserved for the engine's event accumulators"):
            await engine.publish_event(f"{ACCUMULATOR_PREFIX}{target.name}", 1)
        client = durably.Client(engine.store)
        with pytest.raises(ValueError, match="belongs to the engine"):
            await client.start(BATCH_WORKFLOW, {"target": target.name})
        with pytest.raises(ValueError, match="belongs to the engine"):
            await client.signal_with_start(DEBOUNCE_WORKFLOW, {}, run_id="x", token="t", payload=1)


async def test_an_engine_without_debounce_or_batch_registers_no_accumulator(
    engine_factory: EngineFactory, uid: str
) -> None:
    plain = echo(uid, "plain", on_event=[f"{uid}.e"])
    async with engine_factory(workflows=[plain]) as engine:
        assert engine.registration(DEBOUNCE_WORKFLOW) is None
        # registered later: the accumulators come with it
        engine.register(echo(uid, "late", on_event=[f"{uid}.e"], batch=Batch(2, "1s")))
        assert engine.registration(BATCH_WORKFLOW) is not None


async def test_a_cancelled_accumulator_keeps_its_events_and_resumes_when_requeued(
    engine_factory: EngineFactory, uid: str
) -> None:
    name = f"{uid}.evt"
    target = echo(uid, "batched", on_event=[name], batch=Batch(max_size=2, within="5s"))
    head = f"{ACCUMULATOR_PREFIX}{target.name}"
    async with engine_factory(workflows=[target]) as engine:
        await engine.publish_event(name, 1)
        await wait_until(lambda: _status_is(engine, head, "suspended"))
        await engine.cancel(head)
        await engine.publish_event(name, 2)
        await engine.publish_event(name, 3)
        await asyncio.sleep(0.3)
        assert await engine.store.list_runs(RunQuery(workflow=target.name)) == []
        await engine.requeue(head)
        runs = await completed_runs(engine, target.name, 1)
    assert runs[0].output == {"events": [1, 2]}


async def _status_is(engine: durably.Engine, run_id: str, status: str) -> bool:
    run = await engine.get_run(run_id)
    return run is not None and run.status == status


async def test_a_target_the_accumulating_engine_lacks_is_started_by_name_not_dropped(
    engine_factory: EngineFactory, uid: str
) -> None:
    """The engine that flushes may not have the target (a fleet whose engines register
    different workflows): the run is created by name, and an engine that has it runs it."""
    name = f"{uid}.evt"
    target = echo(uid, "batched", on_event=[name], batch=Batch(max_size=10, within="300ms"))
    other = echo(uid, "other", on_event=[f"{uid}.other"], debounce="1s")
    head = f"{ACCUMULATOR_PREFIX}{target.name}"
    async with engine_factory(workflows=[target], drive=False) as publisher:
        await publisher.publish_event(name, 7)
    async with engine_factory(workflows=[other]) as flusher:

        async def started_by_name() -> bool:
            return bool(await flusher.store.list_runs(RunQuery(workflow=target.name)))

        await wait_until(started_by_name)
        await wait_until(lambda: _status_is(flusher, head, "completed"))
    async with engine_factory(workflows=[target]) as runner:
        [run] = await completed_runs(runner, target.name, 1)
    assert run.output == {"events": [7]}
