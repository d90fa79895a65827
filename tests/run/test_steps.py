"""ctx.step: outputs and checkpoints, typed I/O, retries and errors,
cancellation and a restart during retry backoff.

ctx.local_step, ctx.side_effect, ctx.now and gathered/replayed steps are in
test_local_steps.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any, TypedDict

import pytest
from pydantic import BaseModel

import durably
from durably import FatalError, RemoteStepError, RunFailedError, WorkflowCtx
from tests.engine_support import (
    RESULT_TIMEOUT,
    EngineFactory,
    EventLog,
    bump,
    shape,
    wait_suspended,
)

# --------------------------------------------------------------------------- ctx.step


async def test_sequential_steps_outputs_and_checkpoints(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.double")
    async def double(x: int) -> int:
        bump(counts, "double")
        return x * 2

    @durably.step(f"{uid}.inc")
    def inc(x: int) -> int:
        bump(counts, "inc")
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> list[int]:
        a = await ctx.step(double, x)
        b = await ctx.step(inc, a)
        c = await ctx.step(double, b)
        return [a, b, c]

    async with engine_factory() as engine:
        handle = await engine.start(wf, 5)
        assert await handle.result(timeout=RESULT_TIMEOUT) == [10, 11, 22]
        cps = await engine.list_checkpoints(handle.run_id)
        run = await engine.get_run(handle.run_id)

    assert counts == {"double": 2, "inc": 1}
    assert shape(cps) == [
        (0, f"{uid}.double", "remote", "completed"),
        (1, f"{uid}.inc", "remote", "completed"),
        (2, f"{uid}.double", "remote", "completed"),
    ]
    assert [cp.input for cp in cps] == [5, 10, 11]
    assert [cp.output for cp in cps] == [10, 11, 22]
    assert [cp.attempts for cp in cps] == [1, 1, 1]
    assert [cp.step_id for cp in cps] == [f"{handle.run_id}:{i}" for i in range(3)]
    assert run is not None
    assert run.status == "completed"
    assert run.output == [10, 11, 22]
    assert run.error is None
    assert run.workflow == f"{uid}.wf"
    assert run.workflow_version == "1"


async def test_sync_step_runs_on_engine_thread_pool(engine_factory: EngineFactory, uid: str):
    seen: dict[str, Any] = {}

    @durably.step(f"{uid}.where")
    def where(x: int) -> str:
        seen["thread"] = threading.current_thread().name
        seen["main"] = threading.current_thread() is threading.main_thread()
        return threading.current_thread().name

    @durably.step(f"{uid}.where_async")
    async def where_async(x: int) -> str:
        return threading.current_thread().name

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> dict[str, str]:
        return {"sync": await ctx.step(where, x), "async": await ctx.step(where_async, x)}

    async with engine_factory() as engine:
        loop_thread = threading.current_thread().name
        out = await engine.execute(wf, 1, timeout=RESULT_TIMEOUT)

    assert out["sync"].startswith("durably-step"), out
    assert seen["thread"] == out["sync"]
    assert seen["main"] is False
    # The loop's default executor names its threads "asyncio_N"; we are not on it.
    assert not out["sync"].startswith("asyncio")
    # An async step runs on the event loop's thread.
    assert out["async"] == loop_thread


async def test_step_with_zero_params(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.hello")
    def hello() -> str:
        bump(counts, "hello")
        return "hi"

    @durably.step(f"{uid}.ahello")
    async def ahello() -> str:
        bump(counts, "ahello")
        return "ahi"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[str]:
        return [await ctx.step(hello), await ctx.step(ahello, None)]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == ["hi", "ahi"]
        cps = await engine.list_checkpoints(handle.run_id)

    assert counts == {"hello": 1, "ahello": 1}
    assert [cp.input for cp in cps] == [None, None]
    assert [cp.output for cp in cps] == ["hi", "ahi"]


# ------------------------------------------------------------------------- typed I/O


class Order(BaseModel):
    sku: str
    qty: int


class Receipt(BaseModel):
    sku: str
    total: float


@dataclasses.dataclass
class Box:
    label: str
    weight: float


class Shipment(TypedDict):
    carrier: str
    boxes: int


async def test_typed_io_pydantic_dataclass_typeddict(engine_factory: EngineFactory, uid: str):
    body_saw: list[tuple[str, str, str, str]] = []
    step_saw: list[str] = []

    @durably.step(f"{uid}.price")
    def price(order: Order) -> Receipt:
        step_saw.append(type(order).__name__)
        return Receipt(sku=order.sku, total=order.qty * 2.5)

    @durably.step(f"{uid}.pack")
    async def pack(receipt: Receipt) -> Box:
        step_saw.append(type(receipt).__name__)
        return Box(label=receipt.sku, weight=receipt.total)

    @durably.step(f"{uid}.ship")
    def ship(box: Box) -> Shipment:
        step_saw.append(type(box).__name__)
        return {"carrier": "ups", "boxes": int(box.weight)}

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, order: Order) -> Receipt:
        receipt = await ctx.step(price, order)
        box = await ctx.step(pack, receipt)
        shipment = await ctx.step(ship, box)
        body_saw.append(
            (
                type(order).__name__,
                type(receipt).__name__,
                type(box).__name__,
                type(shipment).__name__,
            )
        )
        assert isinstance(order, Order)
        assert isinstance(receipt, Receipt)
        assert isinstance(box, Box)
        assert shipment == {"carrier": "ups", "boxes": 10}
        return Receipt(sku=f"{receipt.sku}/{shipment['carrier']}", total=box.weight)

    async with engine_factory() as engine:
        # A dict input is validated into the model; the store holds JSON.
        handle = await engine.start(wf, {"sku": "abc", "qty": 4})
        out = await handle.result(timeout=RESULT_TIMEOUT)
        run = await engine.get_run(handle.run_id)
        cps = await engine.list_checkpoints(handle.run_id)

    assert isinstance(out, Receipt)
    assert out == Receipt(sku="abc/ups", total=10.0)
    assert step_saw == ["Order", "Receipt", "Box"]
    # The body sees typed objects on every (re)play.
    assert body_saw and set(body_saw) == {("Order", "Receipt", "Box", "dict")}
    assert run is not None
    assert run.input == {"sku": "abc", "qty": 4}
    assert run.output == {"sku": "abc/ups", "total": 10.0}
    assert [cp.output for cp in cps] == [
        {"sku": "abc", "total": 10.0},
        {"label": "abc", "weight": 10.0},
        {"carrier": "ups", "boxes": 10},
    ]
    assert cps[0].input == {"sku": "abc", "qty": 4}


async def test_typed_io_survives_replay_after_wait(engine_factory: EngineFactory, uid: str):
    """The typed value from a checkpoint is rebuilt when the body replays after a wait."""
    seen: list[str] = []

    @durably.step(f"{uid}.mk")
    def mk(n: int) -> Box:
        return Box(label=f"b{n}", weight=n / 2)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, n: int) -> str:
        box = await ctx.step(mk, n)
        seen.append(type(box).__name__)
        await ctx.sleep("30ms")
        seen.append(type(box).__name__)
        return f"{box.label}:{box.weight}"

    async with engine_factory() as engine:
        assert await engine.execute(wf, 3, timeout=RESULT_TIMEOUT) == "b3:1.5"

    assert seen and set(seen) == {"Box"}


async def test_step_by_name_string(engine_factory: EngineFactory, uid: str):
    @durably.step(f"{uid}.upper")
    def upper(s: str) -> str:
        return s.upper()

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, s: str) -> str:
        return await ctx.step(f"{uid}.upper", s)

    async with engine_factory() as engine:
        handle = await engine.start(wf, "abc")
        assert await handle.result(timeout=RESULT_TIMEOUT) == "ABC"
        cps = await engine.list_checkpoints(handle.run_id)
    assert shape(cps) == [(0, f"{uid}.upper", "remote", "completed")]


async def test_unknown_step_name_fails_the_run(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.step(f"{uid}.missing", 1, retries=3)

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert info.value.status == "failed"
    assert info.value.error is not None
    assert info.value.error.message == f"no handler for {uid}.missing"
    # Not retried: a missing handler is not retryable.
    assert shape(cps) == [(0, f"{uid}.missing", "remote", "failed")]
    assert cps[0].attempts == 1
    assert cps[0].error is not None and cps[0].error.message == f"no handler for {uid}.missing"


# ----------------------------------------------------------------- retries & errors


async def test_retries_count_attempts_with_exponential_backoff(
    engine_factory: EngineFactory, uid: str
):
    calls: list[float] = []

    @durably.step(f"{uid}.flaky", retries=3, backoff="exponential", backoff_ms="40ms")
    def flaky(x: int) -> int:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise RuntimeError(f"boom {len(calls)}")
        return x * 10

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(flaky, x)

    async with engine_factory() as engine:
        events = EventLog(engine)
        handle = await engine.start(wf, 4)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 40
        cps = await engine.list_checkpoints(handle.run_id)

    assert len(calls) == 3
    # Delays before attempts 2 and 3: 40ms and 80ms (exponential), measured loosely.
    assert calls[1] - calls[0] >= 0.035
    assert calls[2] - calls[1] >= 0.075
    assert shape(cps) == [(0, f"{uid}.flaky", "remote", "completed")]
    assert cps[0].attempts == 3
    assert cps[0].output == 40
    failed = events.of(handle.run_id, "step.failed")
    assert [e.attempt for e in failed] == [1, 2]
    assert [e.attempt for e in events.of(handle.run_id, "step.started")] == [1, 2, 3]


async def test_retries_exhausted_fails_after_exactly_n_attempts(
    engine_factory: EngineFactory, uid: str
):
    calls: list[int] = []

    @durably.step(f"{uid}.always")
    def always(x: int) -> int:
        calls.append(x)
        raise ValueError(f"bad {len(calls)}")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        return await ctx.step(always, 1, retries=3, backoff_ms="5ms")

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert len(calls) == 3  # retries=3 is three attempts in total, not four
    assert info.value.error is not None
    assert info.value.error.message == "bad 3"
    assert shape(cps) == [(0, f"{uid}.always", "remote", "failed")]
    assert cps[0].attempts == 3
    assert cps[0].error is not None and cps[0].error.message == "bad 3"


async def test_fatal_error_is_never_retried(engine_factory: EngineFactory, uid: str):
    calls: list[int] = []

    @durably.step(f"{uid}.fatal", retries=5, backoff_ms="5ms")
    def fatal(x: int) -> int:
        calls.append(x)
        raise FatalError("card declined", code="declined", details={"reason": "funds", "n": x})

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(fatal, x)

    async with engine_factory() as engine:
        handle = await engine.start(wf, 7)
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)
        run = await engine.get_run(handle.run_id)

    assert calls == [7]
    assert shape(cps) == [(0, f"{uid}.fatal", "remote", "failed")]
    assert cps[0].attempts == 1
    assert cps[0].error is not None
    assert cps[0].error.message == "card declined"
    assert cps[0].error.code == "declined"
    assert cps[0].error.details == {"reason": "funds", "n": 7}
    assert cps[0].error.retryable is False
    assert run is not None and run.status == "failed" and run.error is not None
    assert run.error.message == "card declined"
    assert run.error.code == "declined"
    assert run.error.details == {"reason": "funds", "n": 7}
    assert info.value.error == run.error


async def test_step_timeout_per_attempt(engine_factory: EngineFactory, uid: str):
    calls: list[int] = []

    @durably.step(f"{uid}.slow", timeout="60ms", retries=2)
    async def slow(x: int) -> int:
        calls.append(x)
        if len(calls) == 1:
            await asyncio.sleep(5)
        return x + 1

    @durably.step(f"{uid}.stuck", timeout="40ms", retries=2)
    async def stuck(x: int) -> int:
        calls.append(-x)
        await asyncio.sleep(5)
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> Any:
        first = await ctx.step(slow, x)  # first attempt times out, second succeeds
        try:
            await ctx.step(stuck, x)
        except RemoteStepError as exc:
            return [first, exc.code, str(exc)]
        return [first, None, None]

    async with engine_factory() as engine:
        started = time.monotonic()
        handle = await engine.start(wf, 1)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        elapsed = time.monotonic() - started
        cps = await engine.list_checkpoints(handle.run_id)

    assert out == [2, "timeout", f'step "{uid}.stuck" timed out after 40ms']
    assert calls == [1, 1, -1, -1]
    assert elapsed < 3
    assert shape(cps) == [
        (0, f"{uid}.slow", "remote", "completed"),
        (1, f"{uid}.stuck", "remote", "failed"),
    ]
    assert cps[0].attempts == 2
    assert cps[1].attempts == 2
    assert cps[1].error is not None and cps[1].error.code == "timeout"


async def test_remote_step_error_is_catchable_in_body(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.fails")
    def fails(x: int) -> int:
        bump(counts, "fails")
        raise FatalError("nope", code="E_NOPE", details=[1, 2])

    @durably.step(f"{uid}.fallback")
    def fallback(x: int) -> int:
        bump(counts, "fallback")
        return -x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> dict[str, Any]:
        try:
            await ctx.step(fails, x)
        except RemoteStepError as exc:
            recovered = await ctx.step(fallback, x)
            return {"code": exc.code, "details": exc.details, "msg": str(exc), "v": recovered}
        return {}

    async with engine_factory() as engine:
        handle = await engine.start(wf, 3)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert out == {"code": "E_NOPE", "details": [1, 2], "msg": "nope", "v": -3}
    assert counts == {"fails": 1, "fallback": 1}
    assert shape(cps) == [
        (0, f"{uid}.fails", "remote", "failed"),
        (1, f"{uid}.fallback", "remote", "completed"),
    ]


async def test_step_returning_non_json_value_fails_clearly(engine_factory: EngineFactory, uid: str):
    calls: list[int] = []

    @durably.step(f"{uid}.weird", retries=3)
    def weird(x: int) -> Any:
        calls.append(x)
        return object()

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.step(weird, 1)

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    error = info.value.error
    assert error is not None
    assert f'step "{uid}.weird" returned a value that cannot be stored' in error.message
    assert "object" in error.message
    assert error.code == "serialization"
    assert calls == [1]  # a serialization failure is not retried
    # No garbage checkpoint: only the failed row, holding no output.
    assert shape(cps) == [(0, f"{uid}.weird", "remote", "failed")]
    assert cps[0].output is None


async def test_completed_steps_execute_exactly_once(engine_factory: EngineFactory, uid: str):
    """Each step body runs once in BOTH modes, although replay mode re-runs the body."""
    counts: dict[str, int] = {}
    body_runs: list[int] = []

    def make(i: int) -> durably.Step[int, int]:
        @durably.step(f"{uid}.s{i}")
        def s(x: int) -> int:
            bump(counts, f"s{i}")
            return x + i

        return s

    steps = [make(i) for i in range(5)]

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        body_runs.append(1)
        for st in steps:
            x = await ctx.step(st, x)
            if x == 3:
                await ctx.sleep("20ms")
        return x

    async with engine_factory() as engine:
        handle = await engine.start(wf, 0)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 10
        cps = await engine.list_checkpoints(handle.run_id)

    assert counts == {f"s{i}": 1 for i in range(5)}
    assert [cp.name for cp in cps] == [
        f"{uid}.s0",
        f"{uid}.s1",
        f"{uid}.s2",
        "sleep",
        f"{uid}.s3",
        f"{uid}.s4",
    ]
    if engine_factory.replay:
        assert len(body_runs) > 1  # the body really was replayed
    else:
        assert len(body_runs) == 1  # resident: never replayed


# ------------------------------------------------------------ cancellation & restart


async def test_cancel_while_a_step_runs(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}
    started = asyncio.Event()

    @durably.step(f"{uid}.long")
    async def long(x: int) -> int:
        bump(counts, "long")
        started.set()
        await asyncio.sleep(0.3)
        bump(counts, "long-finished")
        return x

    @durably.step(f"{uid}.after")
    def after(x: int) -> int:
        bump(counts, "after")
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        a = await ctx.step(long, 1)
        return await ctx.step(after, a)

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await asyncio.wait_for(started.wait(), RESULT_TIMEOUT)
        result = await engine.cancel(handle.run_id)
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        await asyncio.sleep(0.4)
        row = await engine.get_run(handle.run_id)
        cps = await engine.list_checkpoints(handle.run_id)

    assert result is not None and result.status == "cancelled"
    assert info.value.status == "cancelled"
    assert row is not None and row.status == "cancelled"
    assert counts == {"long": 1}  # the in-flight async step was cancelled; nothing after it
    assert cps == []


async def test_cancel_during_retry_backoff(engine_factory: EngineFactory, uid: str):
    calls: list[int] = []

    # A backoff long enough for the cancel to land first on a loaded machine: the test is
    # that no retry runs once the run is cancelled, not how fast a cancel is.
    @durably.step(f"{uid}.down", retries=5, backoff_ms="1s")
    def down(x: int) -> int:
        calls.append(x)
        raise RuntimeError("down")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        return await ctx.step(down, 1)

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        waiting = await wait_suspended(engine, handle.run_id)
        await engine.cancel(handle.run_id)
        assert waiting.wake_at is not None
        await asyncio.sleep(max(0.0, waiting.wake_at / 1000 - time.time()) + 0.3)  # past it
        row = await engine.get_run(handle.run_id)
        cps = await engine.list_checkpoints(handle.run_id)

    assert waiting.wake_at is not None
    assert cps[0].wake_at == waiting.wake_at  # the retry deadline is stamped on the row
    assert calls == [1]
    assert row is not None and row.status == "cancelled"
    assert shape(cps) == [(0, f"{uid}.down", "remote", "failed")]


async def test_retry_backoff_survives_an_engine_restart(engine_factory: EngineFactory, uid: str):
    calls: list[int] = []

    # A backoff long enough that the run is still waiting in it when the test looks (a short
    # one can be over by then on a loaded machine).
    @durably.step(f"{uid}.flaky", retries=3, backoff_ms="2s")
    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) == 1:
            raise RuntimeError("transient")
        return x * 2

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(flaky, x)

    async with engine_factory() as engine:
        handle = await engine.start(wf, 21)
        waiting = await wait_suspended(engine, handle.run_id)
    async with engine_factory() as engine:
        assert await engine.get_handle(handle.run_id).result(timeout=RESULT_TIMEOUT) == 42
        cps = await engine.list_checkpoints(handle.run_id)

    assert waiting.wake_at is not None
    assert calls == [21, 21]
    assert shape(cps) == [(0, f"{uid}.flaky", "remote", "completed")]
    assert cps[0].attempts == 2
