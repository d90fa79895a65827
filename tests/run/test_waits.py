"""Durable waits: sleep, signals, events, set_event/get_event."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import durably
from durably import SignalTimeoutError, WorkflowCtx
from tests.engine_support import (
    RESULT_TIMEOUT,
    EngineFactory,
    EventLog,
    shape,
    wait_suspended,
    wait_until,
    wait_waiting_on,
)

# ------------------------------------------------------------------------------ sleep

# How long a wait lasts in a test that inspects the run WHILE it waits: the check comes after
# the run settled `suspended` (`wait_suspended`), but a short wait can be over by then on a
# loaded 2-core machine (a 250 ms sleep was). The check waits on the state; the wait only has
# to outlast the time it takes to get there.
WAIT_S = 2


async def test_sleep_is_durable_and_suspends_the_run(engine_factory: EngineFactory, uid: str):
    marks: list[str] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        marks.append("before")
        await ctx.sleep(f"{WAIT_S}s")
        marks.append("after")
        return "woke"

    async with engine_factory() as engine:
        events = EventLog(engine)
        started = time.monotonic()
        handle = await engine.start(wf)
        run = await wait_suspended(engine, handle.run_id)
        cps = await engine.list_checkpoints(handle.run_id)
        assert "after" not in marks

        assert await handle.result(timeout=RESULT_TIMEOUT) == "woke"
        elapsed = time.monotonic() - started
        done = await engine.get_run(handle.run_id)

    assert run.status == "suspended"
    assert shape(cps) == [(0, "sleep", "sleep", "completed")]
    wake_at = cps[0].wake_at
    assert wake_at is not None
    assert cps[0].finished_at is not None
    created_ms = int(cps[0].started_at.timestamp() * 1000)
    assert WAIT_S * 1000 - 10 <= wake_at - created_ms <= WAIT_S * 1000 + 500
    # The run row carries the wake time while it sleeps.
    assert run.wake_at == wake_at
    assert elapsed >= WAIT_S - 0.01
    assert done is not None and done.status == "completed" and done.wake_at is None
    assert "run.suspended" in events.types(handle.run_id)
    assert marks[-1] == "after"


async def test_sleep_until(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, when: str) -> str:
        await ctx.sleep_until(datetime.fromisoformat(when))
        return "done"

    when = datetime.now(UTC) + timedelta(seconds=WAIT_S)
    async with engine_factory() as engine:
        handle = await engine.start(wf, when.isoformat())
        run = await wait_suspended(engine, handle.run_id)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "done"
        finished = datetime.now(UTC)
        cps = await engine.list_checkpoints(handle.run_id)

    assert finished >= when
    target = round(when.timestamp() * 1000)
    assert shape(cps) == [(0, "sleep", "sleep", "completed")]
    assert cps[0].wake_at == target
    assert run.wake_at == target


async def test_sleep_in_the_past_does_not_suspend(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        await ctx.sleep(0)
        await ctx.sleep_until(datetime(2000, 1, 1, tzinfo=UTC))
        return "ok"

    async with engine_factory() as engine:
        events = EventLog(engine)
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "ok"
        cps = await engine.list_checkpoints(handle.run_id)

    assert shape(cps) == [(0, "sleep", "sleep", "completed"), (1, "sleep", "sleep", "completed")]
    assert "run.suspended" not in events.types(handle.run_id)


# ---------------------------------------------------------------------------- signals


async def test_signal_delivered_while_waiting(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.approve"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        payload = await ctx.wait_for_signal(token)
        return {"approved": payload}

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await wait_waiting_on(engine, handle.run_id, token)
        before = await engine.list_checkpoints(handle.run_id)
        result = await engine.signal(token, {"by": "alice"})
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)
        waiters = await engine.store.list_signal_waiters(token)

    assert before == []  # an unbounded wait writes nothing until delivery
    assert result is not None and result.run_id == handle.run_id
    assert out == {"approved": {"by": "alice"}}
    assert shape(cps) == [(0, f"signal:{token}", "signal", "completed")]
    assert cps[0].output == {"by": "alice"}
    assert waiters == []


async def test_signal_sent_before_the_wait_is_buffered(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.early"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        await ctx.sleep("30ms")
        first = await ctx.wait_for_signal(token)
        second = await ctx.wait_for_signal(token)
        return [first, second]

    async with engine_factory() as engine:
        # Nobody waits yet: both signals are buffered, consumed in order by the two waits.
        assert await engine.signal(token, 1) is None
        assert await engine.signal(token, 2) is None
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == [1, 2]
        cps = await engine.list_checkpoints(handle.run_id)
        leftover = await engine.store.peek_buffered_signals(token, 1)

    assert shape(cps) == [
        (0, "sleep", "sleep", "completed"),
        (1, f"signal:{token}", "signal", "completed"),
        (2, f"signal:{token}", "signal", "completed"),
    ]
    assert leftover == []


async def test_signal_timeout_is_catchable(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.never"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        try:
            await ctx.wait_for_signal(token, timeout=f"{WAIT_S}s")
        except SignalTimeoutError as exc:
            return {"timed_out": True, "token": exc.token, "ms": exc.timeout_ms}
        return {"timed_out": False}

    async with engine_factory() as engine:
        started = time.monotonic()
        handle = await engine.start(wf)
        run = await wait_suspended(engine, handle.run_id)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        elapsed = time.monotonic() - started
        cps = await engine.list_checkpoints(handle.run_id)
        waiters = await engine.store.list_signal_waiters(token)

    assert out == {"timed_out": True, "token": token, "ms": WAIT_S * 1000}
    assert elapsed >= WAIT_S - 0.01
    # A bounded wait claims two positions: the deadline, then the wait (never written).
    assert shape(cps) == [(0, f"timeout:{token}", "sleep", "completed")]
    assert cps[0].wake_at is not None
    assert run.wake_at == cps[0].wake_at
    assert waiters == []  # the timed-out wait removed its own waiter row


async def test_signal_within_timeout_wins(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.quick"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(token, timeout="5s")

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await wait_waiting_on(engine, handle.run_id, token)
        await engine.signal(token, "fast")
        assert await handle.result(timeout=RESULT_TIMEOUT) == "fast"
        cps = await engine.list_checkpoints(handle.run_id)

    assert shape(cps) == [
        (0, f"timeout:{token}", "sleep", "completed"),
        (1, f"signal:{token}", "signal", "completed"),
    ]


async def test_signal_payload_round_trip(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.payload"
    payload = {
        "text": "héllo ✓ 日本",
        "n": 42,
        "f": 1.5,
        "neg": -7,
        "flag": True,
        "none": None,
        "list": [1, "two", [3.0, {"four": 4}]],
        "nested": {"a": {"b": {"c": []}}},
        "tuple": (1, 2),
    }
    expected = {**payload, "tuple": [1, 2]}

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        got = await ctx.wait_for_signal(token)
        again = await ctx.wait_for_signal(token)
        return [got, again]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await wait_waiting_on(engine, handle.run_id, token)
        await engine.signal(token, payload)
        await wait_waiting_on(engine, handle.run_id, token)
        await engine.signal(token, None)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        run = await engine.get_run(handle.run_id)

    assert out == [expected, None]
    assert run is not None and run.output == [expected, None]


# ----------------------------------------------------------------------------- events


async def test_wait_for_event_with_match(engine_factory: EngineFactory, uid: str):
    name = f"{uid}.order.paid"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, order_id: str) -> Any:
        return await ctx.wait_for_event(name, match={"order": order_id})

    async with engine_factory() as engine:
        a = await engine.start(wf, "A")
        b = await engine.start(wf, "B")
        await wait_suspended(engine, a.run_id)
        await wait_suspended(engine, b.run_id)

        touched_b = await engine.publish_event(name, {"order": "B", "amount": 2})
        assert await b.result(timeout=RESULT_TIMEOUT) == {"order": "B", "amount": 2}
        a_row = await engine.get_run(a.run_id)

        touched_none = await engine.publish_event(name, {"order": "Z"}, buffer=False)
        touched_a = await engine.publish_event(name, {"order": "A", "amount": 1})
        assert await a.result(timeout=RESULT_TIMEOUT) == {"order": "A", "amount": 1}
        cps = await engine.list_checkpoints(a.run_id)

    assert touched_b == 1
    assert touched_none == 0
    assert touched_a == 1
    assert a_row is not None and a_row.status == "suspended"  # B's event did not wake A
    assert len(cps) == 1
    assert cps[0].seq == 0 and cps[0].kind == "signal" and cps[0].status == "completed"
    assert cps[0].name.startswith("signal:event:")
    assert cps[0].output == {"order": "A", "amount": 1}


async def test_buffered_event_is_consumed_by_one_matching_waiter(
    engine_factory: EngineFactory, uid: str
):
    name = f"{uid}.shipment"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, key: str) -> Any:
        await ctx.sleep("20ms")
        return await ctx.wait_for_event(name, match={"key": key})

    async with engine_factory() as engine:
        # Nobody waits: both are buffered.
        assert await engine.publish_event(name, {"key": "x", "v": 1}) == 0
        assert await engine.publish_event(name, {"key": "y", "v": 2}) == 0
        hx = await engine.start(wf, "x")
        hy = await engine.start(wf, "y")
        assert await hx.result(timeout=RESULT_TIMEOUT) == {"key": "x", "v": 1}
        assert await hy.result(timeout=RESULT_TIMEOUT) == {"key": "y", "v": 2}
        # A third run finds nothing left in the buffer and keeps waiting.
        hz = await engine.start(wf, "x")
        z = await wait_suspended(engine, hz.run_id)
        left = await engine.store.list_buffered_events(name, 50)
        z_cps = await engine.list_checkpoints(hz.run_id)

    assert z.status == "suspended"
    assert left == []
    assert shape(z_cps) == [(0, "sleep", "sleep", "completed")]


async def test_wait_for_event_timeout(engine_factory: EngineFactory, uid: str):
    name = f"{uid}.nothing"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        try:
            return await ctx.wait_for_event(name, match={"k": 1}, timeout="100ms")
        except SignalTimeoutError as exc:
            return ["timeout", exc.token, exc.timeout_ms]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert out == ["timeout", f"event:{name}", 100]
    assert shape(cps) == [(0, f"timeout:event:{name}", "sleep", "completed")]


async def test_set_event_get_event_latest_wins(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.next"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        await ctx.set_event("progress", {"pct": 10})
        await ctx.set_event("stage", "init")
        await ctx.wait_for_signal(token)
        await ctx.set_event("progress", {"pct": 100})
        return "done"

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await wait_waiting_on(engine, handle.run_id, token)
        mid = await engine.get_event(handle.run_id, "progress")
        stage = await engine.get_event(handle.run_id, "stage")
        missing = await engine.get_event(handle.run_id, "nope")
        await engine.signal(token)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "done"
        final = await engine.get_event(handle.run_id, "progress")
        cps = await engine.list_checkpoints(handle.run_id)

    assert mid == {"pct": 10}
    assert stage == "init"
    assert missing is None
    assert final == {"pct": 100}
    assert shape(cps) == [
        (0, "event:progress", "local", "completed"),
        (1, "event:stage", "local", "completed"),
        (2, f"signal:{token}", "signal", "completed"),
        (3, "event:progress", "local", "completed"),
    ]


async def test_except_exception_does_not_swallow_suspension(
    engine_factory: EngineFactory, uid: str
):
    token = f"{uid}.go"
    caught: list[str] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        try:
            payload = await ctx.wait_for_signal(token)
        except Exception as exc:  # must not see the suspension control flow
            caught.append(type(exc).__name__)
            return "swallowed"
        try:
            await ctx.sleep("20ms")
        except Exception as exc:
            caught.append(type(exc).__name__)
            return "swallowed"
        return {"payload": payload}

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await wait_waiting_on(engine, handle.run_id, token)
        await engine.signal(token, "p")
        assert await handle.result(timeout=RESULT_TIMEOUT) == {"payload": "p"}
        cps = await engine.list_checkpoints(handle.run_id)

    assert caught == []
    assert shape(cps) == [
        (0, f"signal:{token}", "signal", "completed"),
        (1, "sleep", "sleep", "completed"),
    ]


async def test_sleep_survives_an_engine_restart(engine_factory: EngineFactory, uid: str):
    runs: list[int] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        runs.append(1)
        await ctx.sleep(f"{WAIT_S}s")
        return "woke"

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await wait_suspended(engine, handle.run_id)
        before = await engine.list_checkpoints(handle.run_id)
    # The first engine is gone (its resident body evicted); a new one picks the run up.
    async with engine_factory() as engine:
        assert await engine.get_handle(handle.run_id).result(timeout=RESULT_TIMEOUT) == "woke"
        after = await engine.list_checkpoints(handle.run_id)

    assert shape(after) == [(0, "sleep", "sleep", "completed")]
    assert after[0].wake_at == before[0].wake_at  # the deadline is never recomputed
    assert len(runs) >= 2  # the new engine replayed the body


async def test_signal_from_a_non_driving_engine(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.remote"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(token)

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await wait_waiting_on(engine, handle.run_id, token)
        async with engine_factory(drive=False) as replica:
            result = await replica.signal(token, {"from": "replica"})
        assert await handle.result(timeout=RESULT_TIMEOUT) == {"from": "replica"}

    assert result is not None and result.run_id == handle.run_id


async def test_signal_wait_survives_an_engine_restart(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.later"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        first = await ctx.wait_for_signal(token)
        second = await ctx.wait_for_signal(token)
        return [first, second]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await wait_waiting_on(engine, handle.run_id, token)
        await engine.signal(token, 1)
        await wait_until_checkpoints(engine, handle.run_id, 1)
        await wait_waiting_on(engine, handle.run_id, token)
    async with engine_factory() as engine:
        await engine.signal(token, 2)
        assert await engine.get_handle(handle.run_id).result(timeout=RESULT_TIMEOUT) == [1, 2]
        cps = await engine.list_checkpoints(handle.run_id)

    assert shape(cps) == [
        (0, f"signal:{token}", "signal", "completed"),
        (1, f"signal:{token}", "signal", "completed"),
    ]


async def wait_until_checkpoints(engine: durably.Engine, run_id: str, count: int) -> None:
    async def check() -> bool:
        return len(await engine.list_checkpoints(run_id)) >= count

    await wait_until(check)


async def test_delivery_racing_the_end_of_a_classic_turn(
    engine_factory: EngineFactory, uid: str, request: pytest.FixtureRequest
):
    """A signal delivered while the turn that registered the waiter is settling.

    The interleaving is forced: the engine's post-suspend re-read of the awaited checkpoint
    (the lost-wake guard) reads before the delivery writes, and the delivery (write + wake)
    is fully processed before that read returns. Seen for real with SQLite in replay mode."""
    token = f"{uid}.race"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(token)

    async with engine_factory(reconcile_ms=300_000) as engine:
        original = engine.store.get_checkpoint
        raced: list[Any] = []

        async def racing_get_checkpoint(run_id: str, seq: int) -> Any:
            stale = await original(run_id, seq)
            if not raced and stale is None and seq == 0:
                raced.append(await engine.signal(token, "payload"))
            return stale

        engine.store.get_checkpoint = racing_get_checkpoint  # type: ignore[method-assign]
        handle = await engine.start(wf)
        out = await handle.result(timeout=3)

    assert raced and raced[0] is not None  # the delivery took the waiter
    assert out == "payload"


async def test_a_timed_out_wait_replayed_later_leaves_a_newer_signal_to_the_next_wait(
    engine_factory: EngineFactory, uid: str
):
    """A signal wait that timed out, replayed after a signal on its token was buffered, still
    times out: the signal belongs to the next wait on the token. (Taking it in the replay
    rewrote the run's history: the first wait returned it and the second waited forever.)"""
    token, gate = f"{uid}-tok", f"{uid}-gate"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[Any]:
        try:
            first = await ctx.wait_for_signal(token, timeout="50ms")
        except SignalTimeoutError:
            first = "timed out"
        opened = await ctx.wait_for_signal(gate)
        second = await ctx.wait_for_signal(token)
        return [first, opened, second]

    async with engine_factory() as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        await wait_waiting_on(engine, handle.run_id, gate)  # the first wait timed out
        await engine.signal(token, "late")  # no waiter: buffered
        await engine.signal(gate, "go")  # wakes the run (a replay, in replay mode)
        assert await handle.result(timeout=RESULT_TIMEOUT) == ["timed out", "go", "late"]


async def test_a_timed_out_event_wait_replayed_later_leaves_a_newer_event_to_the_next_wait(
    engine_factory: EngineFactory, uid: str
):
    """The same for `wait_for_event`: its replay registers no waiter and takes no event."""
    name, gate = f"{uid}.evt", f"{uid}-gate"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[Any]:
        try:
            first = await ctx.wait_for_event(name, timeout="50ms")
        except SignalTimeoutError:
            first = "timed out"
        opened = await ctx.wait_for_signal(gate)
        second = await ctx.wait_for_event(name)
        return [first, opened, second]

    async with engine_factory() as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        await wait_waiting_on(engine, handle.run_id, gate)  # the event wait timed out
        await engine.publish_event(name, {"n": 1})  # no waiter: buffered
        await engine.signal(gate, "go")
        assert await handle.result(timeout=RESULT_TIMEOUT) == ["timed out", "go", {"n": 1}]
