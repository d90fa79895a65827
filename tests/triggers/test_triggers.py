"""Event triggers end to end: `on_event` starts (with equality and predicate matches), and
the `debounce=` / `batch=` accumulators — per target, per key (`key=`) and per namespace —
on every store and in both execution modes.

The accumulators are built-in workflows that take stored events when a signal wakes them;
the crash half of their promise (kill -9 between the events and the flush) is
tests/faults/test_trigger_faults.py.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

import durably
from durably import Batch, Debounce, EventKeyError, EventTrigger, RunQuery, WorkflowCtx, WorkflowRun
from durably._core import ids as durably_ids
from durably._core.triggers import (
    ACCUMULATOR_PREFIX,
    BATCH_WORKFLOW,
    DEBOUNCE_WORKFLOW,
    accumulator_id,
)
from durably._engine.triggers import subscribers as triggers
from tests.engine_support import RESULT_TIMEOUT, EngineFactory, wait_until

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


async def chain_closed(engine: durably.Engine, builtin: str, n: int) -> list[WorkflowRun]:
    """Wait until the `builtin` accumulator has `n` runs, all completed (the chains closed);
    returns them in chain order."""
    found: list[WorkflowRun] = []

    async def check() -> bool:
        found[:] = await engine.store.list_runs(RunQuery(workflow=builtin))
        return len(found) >= n and all(r.status == "completed" for r in found)

    await wait_until(check, timeout=RESULT_TIMEOUT)
    assert len(found) == n, [(r.id, r.status) for r in found]
    return sorted(found, key=lambda r: (len(r.id), r.id))


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
        assert (await engine.get_handle(f"evt:e1:{uid}.eur").result(timeout=RESULT_TIMEOUT))[
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
        head = accumulator_id("default", target.name)
        assert head == f"{ACCUMULATOR_PREFIX}default:{target.name}"
        chain = await chain_closed(engine, DEBOUNCE_WORKFLOW, 2)
        # the idle chain holds nothing: no run waits, no event or wake-up is left stored;
        # its marker names the run the next event creates
        assert await engine.store.list_buffered_events(head, 10) == []
        assert await engine.store.count_buffered_signals(prefix=head) == 0
        [marker] = await engine.store.list_buffered_events(f"{head}#next", 10)
        assert marker.payload == 2
    # one accumulator run per delivery: the first closed the chain (or, when the sixth event
    # came before it closed, handed over), the sixth event's run closed it again
    assert [r.id for r in chain] == [head, f"{head}~1"]
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
        await chain_closed(engine, BATCH_WORKFLOW, 2)  # two deliveries; nothing waits after
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
    first = next(r for r in chain if r.id == accumulator_id("default", total.name))
    assert first.status == "completed" and first.output is not None
    assert first.output["started"] is None and "invalid input" in first.output["error"]


# ------------------------------------------------------------------ per key, per namespace


def by_key(payload: Any) -> str | None:
    """The accumulator key of the tests' events: `{"k": ...}`; None without one."""
    key = payload.get("k")
    return key if key is None or isinstance(key, str) else str(key)


# A key that is all the characters an id must not carry as they are: separators, the
# chain's suffix mark, the escape mark, a control character and non-ASCII.
ODD_KEY = "o:1~2#%41/\x00ü"


async def test_debounce_per_key_keeps_one_quiet_period_and_last_payload_per_key(
    engine_factory: EngineFactory, uid: str
) -> None:
    name = f"{uid}.evt"
    target = echo(uid, "debounced", on_event=[name], debounce=Debounce(WINDOW, key=by_key))
    async with engine_factory(workflows=[target]) as engine:
        await engine.publish_event(name, {"k": "a", "i": 0})
        # key b keeps publishing for longer than the window: a's quiet period is its own
        for i in range(8):
            await engine.publish_event(name, {"k": "b", "i": i})
            await asyncio.sleep(0.1)
        runs = await engine.store.list_runs(RunQuery(workflow=target.name))
        assert [r.input for r in runs] == [{"k": "a", "i": 0}]
        for k in (ODD_KEY, "a", ODD_KEY):  # a key again, after its chain closed
            await engine.publish_event(name, {"k": k, "i": 9})
        await engine.publish_event(name, {"i": 10})  # no key: the shared accumulator
        runs = await completed_runs(engine, target.name, 5)
        chain = await chain_closed(engine, DEBOUNCE_WORKFLOW, 5)
    outputs = [r.output for r in runs]
    assert outputs[0] == {"k": "a", "i": 0}
    assert sorted(outputs[1:], key=str) == sorted(
        [{"k": "b", "i": 7}, {"k": "a", "i": 9}, {"k": ODD_KEY, "i": 9}, {"i": 10}], key=str
    )
    ids = {r.id for r in chain}
    assert ids == {
        accumulator_id("default", target.name, "a"),
        f"{accumulator_id('default', target.name, 'a')}~1",  # a's chain reopened
        accumulator_id("default", target.name, "b"),
        accumulator_id("default", target.name, ODD_KEY),
        accumulator_id("default", target.name),
    }
    assert {r.input["key"] for r in chain if "key" in r.input} == {"a", "b", ODD_KEY}


async def test_batch_per_key_batches_each_key_in_publish_order(
    engine_factory: EngineFactory, uid: str
) -> None:
    name = f"{uid}.evt"
    batch = Batch(max_size=2, within="400ms", key=by_key)
    target = echo(uid, "batched", on_event=[name], batch=batch)
    async with engine_factory(workflows=[target]) as engine:
        for k, n in [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), (ODD_KEY, 1)]:
            assert await engine.publish_event(name, {"k": k, "n": n}) == 1
        runs = await completed_runs(engine, target.name, 4)
        await chain_closed(engine, BATCH_WORKFLOW, 4)  # a: 2 runs, b: 1, the odd key: 1
    per_key: dict[str, list[list[int]]] = {}
    for run in runs:
        assert run.output is not None
        events = run.output["events"]
        assert len({e["k"] for e in events}) == 1  # never two keys in one batch
        per_key.setdefault(events[0]["k"], []).append([e["n"] for e in events])
    assert per_key == {"a": [[1, 2], [3]], "b": [[1, 2]], ODD_KEY: [[1]]}


async def test_chains_closing_and_reopening_under_two_publishing_engines_lose_nothing(
    engine_factory: EngineFactory, uid: str
) -> None:
    """Six keys published from two engines at uneven paces, with a short window: chains close
    and reopen all the time, while the other engine publishes and drives. Each key's events
    arrive exactly once, in publish order, following its chain run by run."""
    name = f"{uid}.evt"
    batch = Batch(max_size=3, within="40ms", key=by_key)
    target = echo(uid, "batched", on_event=[name], batch=batch)
    pace = random.Random(7)
    keys, per_key = [f"k{i}" for i in range(6)], 10
    async with (
        engine_factory(workflows=[target]) as one,
        engine_factory(workflows=[target]) as two,
    ):

        async def publish(engine: durably.Engine, key: str) -> None:
            for n in range(per_key):
                await engine.publish_event(name, {"k": key, "n": n})
                await asyncio.sleep(pace.choice([0, 0, 0.01, 0.03, 0.06]))

        await asyncio.gather(*(publish((one, two)[i % 2], k) for i, k in enumerate(keys)))

        async def all_delivered() -> bool:
            runs = await one.store.list_runs(RunQuery(workflow=target.name))
            done = [r for r in runs if r.status == "completed" and r.output is not None]
            return sum(len(r.output["events"]) for r in done) >= len(keys) * per_key

        await wait_until(all_delivered, timeout=15)
        await asyncio.sleep(0.2)  # nothing more comes
        outputs = {
            r.id: r.output for r in await one.store.list_runs(RunQuery(workflow=target.name))
        }
        chain = await chain_closed(
            one, BATCH_WORKFLOW, len(await one.store.list_runs(RunQuery(workflow=BATCH_WORKFLOW)))
        )
    got: dict[str, list[int]] = {}
    for run in chain:  # chain order (the id's `~<n>`, head first)
        started = run.output["started"] if run.output else None
        if started:
            events = outputs.pop(started)["events"]  # type: ignore[index]
            got.setdefault(run.input["key"], []).extend(e["n"] for e in events)
            assert {e["k"] for e in events} == {run.input["key"]}
    assert outputs == {}  # every target run was started by its key's chain
    assert got == {k: list(range(per_key)) for k in keys}


async def test_namespaces_on_one_store_have_separate_accumulators(
    engine_factory: EngineFactory, uid: str
) -> None:
    name = f"{uid}.evt"
    target = echo(uid, "batched", on_event=[name], batch=Batch(max_size=2, within="300ms"))
    keyed = echo(uid, "keyed", on_event=[name], debounce=Debounce(WINDOW, key=by_key))
    async with (
        engine_factory(workflows=[target, keyed], namespace="blue") as blue,
        engine_factory(workflows=[target, keyed], namespace="green") as green,
    ):
        await blue.publish_event(name, {"k": "a", "ns": "blue"})
        await green.publish_event(name, {"k": "a", "ns": "green"})
        batches = await completed_runs(blue, target.name, 2)
        debounced = await completed_runs(blue, keyed.name, 2)
    for runs in (batches, debounced):
        seen = {r.namespace: r.output for r in runs}
        assert set(seen) == {"blue", "green"}
    assert {r.namespace: r.output for r in batches} == {
        "blue": {"events": [{"k": "a", "ns": "blue"}]},
        "green": {"events": [{"k": "a", "ns": "green"}]},
    }
    assert {r.namespace: r.output for r in debounced} == {
        "blue": {"k": "a", "ns": "blue"},
        "green": {"k": "a", "ns": "green"},
    }


def test_accumulator_ids_never_collide_and_obey_the_run_id_rule() -> None:
    cases = [
        ("default", "t", None),
        ("default", "t", ""),
        ("default", "t", "a"),
        ("default", "t", "A"),
        ("default", "t", "%41"),  # an escaped 'A' is not 'A'
        ("default", "t", "a~1"),  # not run 1 of key a's chain
        ("default", "t", "a:b"),  # not key b of target t:a
        ("default", "t:a", "b"),
        ("default:t", "a", "b"),  # not namespace default, target t
        ("default", "t", "#" + "0" * 32),
        ("default", "t", "k" * 10_000),  # hashed: distinct from its escaped prefix
        ("default", "t", "k" * 89),
        ("default", "t", "k" * 10_001),
        ("ns", "t", "a"),
        (None, "t", "a"),  # no namespace is the default one
        ("default", "t", ODD_KEY),
        ("default", "t", "\ud800"),  # a lone surrogate (JSON allows it)
        ("n" * 500, "t" * 500, "\u0000" * 500),
    ]
    ids = [accumulator_id(ns, target, key) for ns, target, key in cases]
    assert ids[14] == ids[2]  # no namespace is the default one
    assert len(set(ids)) == len(ids) - 1  # no other two share an id
    for run_id in ids:
        # printable, without the chain's own marks, and room left for `~<n>`
        durably_ids.validate_run_id(f"{run_id}~9999999999")
        rest = run_id.removeprefix(ACCUMULATOR_PREFIX)
        assert "~" not in rest and rest.count(":") in (1, 2), run_id


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


def test_debounce_and_batch_arguments_and_keys_are_checked_when_declared(uid: str) -> None:
    with pytest.raises(ValueError, match="Debounce window must be a positive duration"):
        Debounce(0)
    with pytest.raises(ValueError, match="Debounce window must be a positive duration"):
        Debounce("soon")
    with pytest.raises(TypeError, match="key must be a callable"):
        Debounce("1s", key="order_id")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Batch\.within must be a positive duration"):
        Batch(2, "0s")
    with pytest.raises(ValueError, match=r"Batch\.max_size"):
        Batch(True, "1s")
    with pytest.raises(TypeError, match="key must be a callable"):
        Batch(2, "1s", key=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"durably\.Debounce"):
        durably.workflow(f"{uid}.a", on_event=["e"], debounce=by_key)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"durably\.Debounce"):
        durably.workflow(f"{uid}.b", on_event=["e"], debounce=Batch(2, "1s"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"debounce= needs on_event"):
        durably.workflow(f"{uid}.c", debounce=Debounce("1s", key=by_key))
    with pytest.raises(ValueError, match="mutually exclusive"):
        durably.workflow(f"{uid}.d", on_event=["e"], debounce=Debounce("1s"), batch=Batch(2, 1))
    assert durably.workflow(f"{uid}.e", on_event=["e"], debounce=Debounce("1s", key=by_key))


async def test_a_key_function_that_fails_refuses_the_whole_publish(
    engine_factory: EngineFactory, uid: str
) -> None:
    name = f"{uid}.evt"

    def strict(payload: Any) -> str | None:
        return payload["order"]  # type: ignore[no-any-return]  # a KeyError without one

    plain = echo(uid, "plain", on_event=[name])
    keyed = echo(uid, "keyed", on_event=[name], batch=Batch(2, "300ms", key=strict))
    picky = echo(
        uid,
        "picky",
        on_event=[EventTrigger(name, match={"vip": True})],
        debounce=Debounce("300ms", key=strict),
    )
    async with engine_factory(workflows=[plain, keyed, picky]) as engine:
        with pytest.raises(EventKeyError, match=rf"workflow '{uid}\.keyed' raised KeyError") as err:
            await engine.publish_event(name, {"no": "order"})
        assert err.value.workflow == keyed.name and err.value.event == name
        assert isinstance(err.value.__cause__, KeyError)
        with pytest.raises(EventKeyError, match="returned int 17"):
            await engine.publish_event(name, {"order": 17})
        # nothing of either publish went anywhere: no run, no stored event, no accumulator
        assert await engine.store.list_runs(RunQuery()) == []
        assert await engine.store.list_buffered_events(name, 10) == []
        # the key of a workflow whose trigger does not match is never asked for
        assert await engine.publish_event(name, {"order": "o-1"}) == 2
        await completed_runs(engine, keyed.name, 1)
        await completed_runs(engine, plain.name, 1)
        assert await engine.store.list_runs(RunQuery(workflow=picky.name)) == []


def test_engine_level_debounce_points_at_the_workflow_option() -> None:
    for option in ("debounce", "batch", "event_batch"):
        with pytest.raises(TypeError, match=r"did you mean @durably\.workflow"):
            durably.Engine(store=durably.InMemoryStateStore(), **{option: "1s"})


async def test_the_accumulators_cannot_be_started_or_signalled_from_outside(
    engine_factory: EngineFactory, uid: str
) -> None:
    name = f"{uid}.evt"
    target = echo(uid, "debounced", on_event=[name], debounce="10s")

    @durably.workflow(f"{uid}.robber")
    async def waits_for_event(ctx: durably.WorkflowCtx, event_name: str) -> Any:
        return await ctx.wait_for_event(event_name)

    async with engine_factory(workflows=[target, waits_for_event]) as engine:
        assert engine.registration(DEBOUNCE_WORKFLOW) is not None
        for workflow in (DEBOUNCE_WORKFLOW, BATCH_WORKFLOW):
            with pytest.raises(ValueError, match="belongs to the engine"):
                await engine.start(workflow, {"target": target.name, "windowMs": 1})
        head = accumulator_id("default", target.name)
        with pytest.raises(ValueError, match="reserved for the engine's event accumulators"):
            await engine.start(target, 1, run_id=head)
        with pytest.raises(durably.ReservedTokenError, match="event accumulator"):
            await engine.signal(head, 1)
        with pytest.raises(ValueError, match="reserved for the engine's event accumulators"):
            await engine.publish_event(head, 1)
        # an event id of that shape could take the place of a chain's marker
        with pytest.raises(ValueError, match=r"event id .* reserved"):
            await engine.publish_event(name, 1, id=f"{head}#next~1")
        client = durably.Client(engine.store)
        with pytest.raises(ValueError, match="belongs to the engine"):
            await client.start(BATCH_WORKFLOW, {"target": target.name})
        # nor can a run wait on a chain's events: it would rob the accumulator of them
        robber = await engine.start(waits_for_event, head, run_id=f"{uid}-robber")
        with pytest.raises(durably.RunFailedError, match="reserved for the engine's event"):
            await robber.result(timeout=10)
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
    head = accumulator_id("default", target.name)
    async with engine_factory(workflows=[target]) as engine:
        await engine.publish_event(name, 1)
        await wait_until(lambda: _status_is(engine, head, "suspended"))
        await engine.cancel(head)
        await engine.publish_event(name, 2)
        await engine.publish_event(name, 3)
        await asyncio.sleep(0.3)
        assert await engine.store.list_runs(RunQuery(workflow=target.name)) == []
        await engine.retry(head)
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
    head = accumulator_id("default", target.name)
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
