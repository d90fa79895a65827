"""ctx.step, ctx.local_step, ctx.side_effect and ctx.now (engine.md §3.1–3.3, §5)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

import pytest
from pydantic import BaseModel

import durably
from durably import (
    FatalError,
    NestedWorkflowCallError,
    RemoteStepError,
    RunFailedError,
    StepFailedError,
    WorkflowCtx,
)

from .conftest import EngineFactory
from .support import RESULT_TIMEOUT, EventLog, bump, shape, wait_suspended, wait_until

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


# ------------------------------------------------------------ local_step / side_effect


async def test_local_step_logger_events_on_checkpoint(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        def body(log: Any) -> int:
            bump(counts, "sync")
            log.info("computing", {"x": x})
            log.warn("careful")
            return x * 3

        async def abody(log: Any) -> int:
            bump(counts, "async")
            log.debug("async body")
            await asyncio.sleep(0)
            return x + 1

        a = await ctx.local_step("triple", body)
        b = await ctx.local_step("plus", abody)
        return a + b

    async with engine_factory() as engine:
        events = EventLog(engine)
        handle = await engine.start(wf, 2)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 9
        cps = await engine.list_checkpoints(handle.run_id)

    assert counts == {"sync": 1, "async": 1}
    assert shape(cps) == [
        (0, "triple", "local", "completed"),
        (1, "plus", "local", "completed"),
    ]
    assert cps[0].output == 6
    assert cps[0].events is not None
    assert [(e.level, e.message, e.data) for e in cps[0].events] == [
        ("info", "computing", {"x": 2}),
        ("warn", "careful", None),
    ]
    assert all(isinstance(e.at, int) and e.at > 0 for e in cps[0].events)
    assert cps[1].events is not None
    assert [(e.level, e.message) for e in cps[1].events] == [("debug", "async body")]
    kinds = [(e.type, e.name, e.kind) for e in events.of(handle.run_id, "step.started")]
    assert kinds == [("step.started", "triple", "local"), ("step.started", "plus", "local")]


async def test_local_step_retries_and_failure(engine_factory: EngineFactory, uid: str):
    calls: list[int] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        def flaky(log: Any) -> str:
            calls.append(1)
            log.info(f"attempt {len(calls)}")
            if len(calls) < 2:
                raise RuntimeError("transient")
            return "ok"

        def fatal(log: Any) -> str:
            calls.append(2)
            raise FatalError("stop", code="STOP")

        first = await ctx.local_step("flaky", flaky, retries=3, backoff_ms="5ms")
        try:
            await ctx.local_step("fatal", fatal, retries=3)
        except FatalError as exc:
            return [first, exc.code]
        return [first, None]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == ["ok", "STOP"]
        cps = await engine.list_checkpoints(handle.run_id)

    assert calls == [1, 1, 2]
    assert shape(cps) == [(0, "flaky", "local", "completed"), (1, "fatal", "local", "failed")]
    assert cps[0].attempts == 2
    # Events are per attempt: only the successful attempt's log is stored.
    assert cps[0].events is not None
    assert [e.message for e in cps[0].events] == ["attempt 2"]
    assert cps[1].error is not None and cps[1].error.code == "STOP"


async def test_side_effect_recorded_once(engine_factory: EngineFactory, uid: str):
    calls: list[int] = []
    seen: list[Any] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        def roll() -> dict[str, Any]:
            calls.append(1)
            return {"roll": 1000 + len(calls), "tuple": (1, 2)}

        value = await ctx.side_effect(roll)
        seen.append(value)
        await ctx.sleep("20ms")
        seen.append(value)
        again = await ctx.side_effect(lambda: "second")
        return [value, again]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert calls == [1]
    # JSON round trip: the live value equals the replayed one (tuples become lists).
    assert out == [{"roll": 1001, "tuple": [1, 2]}, "second"]
    assert all(v == {"roll": 1001, "tuple": [1, 2]} for v in seen)
    assert shape(cps) == [
        (0, "sideEffect", "local", "completed"),
        (1, "sleep", "sleep", "completed"),
        (2, "sideEffect", "local", "completed"),
    ]
    assert cps[0].output == {"roll": 1001, "tuple": [1, 2]}


async def test_now_is_aware_utc_and_stable_on_replay(engine_factory: EngineFactory, uid: str):
    seen: list[datetime] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        t = await ctx.now()
        seen.append(t)
        await ctx.sleep("20ms")
        t2 = await ctx.now()
        seen.append(t2)
        assert t2 >= t
        return t.isoformat()

    async with engine_factory() as engine:
        before = datetime.now(UTC)
        handle = await engine.start(wf)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        after = datetime.now(UTC)
        cps = await engine.list_checkpoints(handle.run_id)

    first = datetime.fromisoformat(out)
    assert first.utcoffset() == timedelta(0)
    assert before - timedelta(milliseconds=1) <= first <= after
    assert all(t.tzinfo is not None and t.utcoffset() == timedelta(0) for t in seen)
    # Every (re)play of the first ctx.now() saw the same recorded instant, and of the
    # second one the same later instant: exactly two distinct values.
    assert seen[0] == first
    assert len(set(seen)) == 2
    assert shape(cps) == [
        (0, "now", "local", "completed"),
        (1, "sleep", "sleep", "completed"),
        (2, "now", "local", "completed"),
    ]
    assert cps[0].output == int(first.timestamp() * 1000)


async def test_nested_ctx_call_inside_local_step(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.inner")
    def inner(x: int) -> int:
        bump(counts, "inner")
        return x

    @durably.workflow(f"{uid}.catching")
    async def catching(ctx: WorkflowCtx) -> Any:
        def bad(log: Any) -> Any:
            return ctx.step(inner, 1)

        try:
            await ctx.local_step("outer", bad)
        except StepFailedError as exc:
            # the recorded failure is re-raised identically on replay (durably decision)
            live = isinstance(exc.__cause__, NestedWorkflowCallError)
            return {
                "code": exc.code,
                "names_primitive_and_step": "ctx.step()" in str(exc) and "'outer'" in str(exc),
                "cause_when_live": live or exc.__cause__ is None,
            }
        return None

    @durably.workflow(f"{uid}.failing")
    async def failing(ctx: WorkflowCtx) -> Any:
        async def bad(log: Any) -> Any:
            await ctx.sleep(1)

        await ctx.local_step("outer", bad)
        return "unreachable"

    async with engine_factory() as engine:
        handle = await engine.start(catching)
        assert await handle.result(timeout=RESULT_TIMEOUT) == {
            "code": "nested_workflow_call",
            "names_primitive_and_step": True,
            "cause_when_live": True,
        }
        caught_cps = await engine.list_checkpoints(handle.run_id)

        failed = await engine.start(failing)
        with pytest.raises(RunFailedError) as info:
            await failed.result(timeout=RESULT_TIMEOUT)
        failed_cps = await engine.list_checkpoints(failed.run_id)

    assert counts == {}
    # The nested call claimed no position: only the local step row exists.
    assert shape(caught_cps) == [(0, "outer", "local", "failed")]
    assert caught_cps[0].error is not None
    assert caught_cps[0].error.code == "nested_workflow_call"
    assert info.value.error is not None
    assert info.value.error.code == "nested_workflow_call"
    assert "ctx.sleep()" in info.value.error.message
    assert shape(failed_cps) == [(0, "outer", "local", "failed")]


async def test_suspended_run_is_never_replayed_when_resident(
    engine_factory: EngineFactory, uid: str
):
    """The body count tells the modes apart; the outcome and history do not."""
    runs: list[int] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        runs.append(1)
        payload = await ctx.wait_for_signal(f"{uid}.go")
        return f"got {payload}"

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await wait_suspended(engine, handle.run_id)
        await engine.signal(f"{uid}.go", "x")
        assert await handle.result(timeout=RESULT_TIMEOUT) == "got x"

    assert len(runs) == (2 if engine_factory.replay else 1)


# ------------------------------------------------------------ concurrency & replay


async def test_gathered_steps_claim_seqs_in_issue_order(engine_factory: EngineFactory, uid: str):
    """Positions are claimed when the primitive is called, not when it completes."""

    @durably.step(f"{uid}.slow")
    async def slow(x: int) -> int:
        await asyncio.sleep(0.05)
        return x

    @durably.step(f"{uid}.fast")
    async def fast(x: int) -> int:
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[int]:
        a, b = await asyncio.gather(ctx.step(slow, 1), ctx.step(fast, 2))
        return [a, b]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == [1, 2]
        cps = await engine.list_checkpoints(handle.run_id)

    assert [(cp.seq, cp.name, cp.output) for cp in cps] == [
        (0, f"{uid}.slow", 1),
        (1, f"{uid}.fast", 2),
    ]


async def test_gathered_steps_execute_exactly_once(
    engine_factory: EngineFactory, uid: str, request: pytest.FixtureRequest
):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.slow")
    async def slow(x: int) -> int:
        bump(counts, "slow")
        await asyncio.sleep(0.2)
        return x

    @durably.step(f"{uid}.fast")
    async def fast(x: int) -> int:
        bump(counts, "fast")
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[Any]:
        a, b = await asyncio.gather(ctx.step(slow, 1), ctx.step(fast, 2))
        c, _ = await asyncio.gather(ctx.step(slow, 3), ctx.sleep("10ms"))
        return [a, b, c]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == [1, 2, 3]
        await asyncio.sleep(0.25)  # let any orphaned duplicate finish before counting

    assert counts == {"slow": 2, "fast": 1}


async def test_caught_local_step_failure_is_not_rerun_on_replay(
    engine_factory: EngineFactory, uid: str, request: pytest.FixtureRequest
):
    """A body that caught a failed local step took a branch; replay must take the same one."""
    calls: list[int] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        def flaky(log: Any) -> str:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("first attempt fails")
            return "ok"

        try:
            outcome = await ctx.local_step("flaky", flaky)
        except Exception:  # whatever class a replay re-raises the recorded failure as
            outcome = "caught"
        await ctx.sleep("20ms")
        return outcome

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert out == "caught"
    assert calls == [1]
    assert shape(cps) == [(0, "flaky", "local", "failed"), (1, "sleep", "sleep", "completed")]


async def test_local_step_running_row_while_body_executes(engine_factory: EngineFactory, uid: str):
    gate = asyncio.Event()
    calls: list[int] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        async def body(log: Any) -> str:
            calls.append(1)
            await gate.wait()
            return "released"

        return await ctx.local_step("gated", body)

    async with engine_factory() as engine:
        handle = await engine.start(wf)

        async def running_row() -> bool:
            return shape(await engine.list_checkpoints(handle.run_id)) == [
                (0, "gated", "local", "running")
            ]

        await wait_until(running_row)
        run = await engine.get_run(handle.run_id)
        gate.set()
        assert await handle.result(timeout=RESULT_TIMEOUT) == "released"
        cps = await engine.list_checkpoints(handle.run_id)

    assert run is not None and run.status == "running"
    assert calls == [1]
    assert shape(cps) == [(0, "gated", "local", "completed")]


async def test_nested_ctx_call_inside_sync_step(engine_factory: EngineFactory, uid: str):
    holder: dict[str, WorkflowCtx] = {}

    @durably.step(f"{uid}.sneaky", retries=3)
    def sneaky(x: int) -> int:
        holder["ctx"].sleep(1)  # a workflow primitive from a step thread
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        holder["ctx"] = ctx
        try:
            return await ctx.step(sneaky, 1)
        except RemoteStepError as exc:
            return exc.code

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "nested_workflow_call"
        cps = await engine.list_checkpoints(handle.run_id)

    assert shape(cps) == [(0, f"{uid}.sneaky", "remote", "failed")]
    assert cps[0].attempts == 1  # a FatalError subclass: not retried


async def test_replay_aware_logger_and_identity(
    engine_factory: EngineFactory, uid: str, caplog: pytest.LogCaptureFixture
):
    identity: list[tuple[str, str, str]] = []

    @durably.workflow(f"{uid}.wf", version="7")
    async def wf(ctx: WorkflowCtx) -> str:
        identity.append((ctx.run_id, ctx.workflow, ctx.version))
        ctx.logger.info("line A")
        await ctx.side_effect(lambda: 1)
        ctx.logger.info("line B")
        await ctx.sleep("10ms")
        ctx.logger.info("line C")
        return "ok"

    caplog.set_level("INFO", logger=f"durably.workflow.{uid}.wf")
    async with engine_factory() as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        assert await handle.result(timeout=RESULT_TIMEOUT) == "ok"

    lines = [r.getMessage() for r in caplog.records if r.name == f"durably.workflow.{uid}.wf"]
    assert lines == ["line A", "line B", "line C"]  # each once, even when replayed
    assert set(identity) == {(f"{uid}-r", f"{uid}.wf", "7")}


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

    @durably.step(f"{uid}.down", retries=5, backoff_ms="300ms")
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
        await asyncio.sleep(0.5)  # past the retry deadline
        row = await engine.get_run(handle.run_id)
        cps = await engine.list_checkpoints(handle.run_id)

    assert waiting.wake_at is not None
    assert cps[0].wake_at == waiting.wake_at  # the retry deadline is stamped on the row
    assert calls == [1]
    assert row is not None and row.status == "cancelled"
    assert shape(cps) == [(0, f"{uid}.down", "remote", "failed")]


async def test_retry_backoff_survives_an_engine_restart(engine_factory: EngineFactory, uid: str):
    calls: list[int] = []

    @durably.step(f"{uid}.flaky", retries=3, backoff_ms="250ms")
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
        assert await engine.handle(handle.run_id).result(timeout=RESULT_TIMEOUT) == 42
        cps = await engine.list_checkpoints(handle.run_id)

    assert waiting.wake_at is not None
    assert calls == [21, 21]
    assert shape(cps) == [(0, f"{uid}.flaky", "remote", "completed")]
    assert cps[0].attempts == 2
