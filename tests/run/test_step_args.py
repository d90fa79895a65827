"""Steps that take arguments: `ctx.step(step, *args, **kwargs)`, `durably.Args` items of
`ctx.all` / `ctx.all_settled`, how a call is stored (one positional argument exactly as a
single input always was; several or keyword arguments as one JSON object), per-parameter
typed validation, option keywords, and replay / restart without running a step again.

Remote steps taking arguments (over Redis, served by a `durably worker`) are in
tests/remote/test_step_args_redis.py.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from pydantic import BaseModel

import durably
from durably import Args, RemoteStepError, WorkflowCtx
from tests.engine_support import (
    RESULT_TIMEOUT,
    EngineFactory,
    shape,
    wait_waiting_on,
)

ARGS, KWARGS = "$durably.args", "$durably.kwargs"


@dataclasses.dataclass
class Order:
    id: str
    amount: int


class Currency(BaseModel):
    code: str


def _charge_step(uid: str, calls: list[Any]) -> Any:
    @durably.step(f"{uid}.charge")
    async def charge(order: Order, rate: float, fee: int, *, currency: Currency) -> str:
        calls.append((order, rate, fee, currency))
        return f"{order.id}:{order.amount * rate + fee:.1f}{currency.code}"

    return charge


# A value of another type given for a typed parameter (a plain dict for a model) is stored as
# given (pydantic warns that it is not of the type) and validated when the step runs, as a
# single input is.
UNVALIDATED_DICT = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")


@UNVALIDATED_DICT
async def test_three_positional_and_one_keyword_argument(engine_factory: EngineFactory, uid: str):
    calls: list[Any] = []
    charge = _charge_step(uid, calls)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, order: Order) -> list[str]:
        first = await ctx.step(charge, order, 1.5, 2, currency=Currency(code="EUR"))
        # a plain dict validates into the parameter's model, like a single input does
        second = await ctx.step(charge, order, 2.0, 0, currency={"code": "USD"})
        return [first, second]

    async with engine_factory() as engine:
        handle = await engine.start(wf, Order("o1", 10))
        assert await handle.result(timeout=RESULT_TIMEOUT) == ["o1:17.0EUR", "o1:20.0USD"]
        cps = await engine.list_checkpoints(handle.run_id)

    # Each call ran once, even when every turn replays the body from its checkpoints.
    assert calls == [
        (Order("o1", 10), 1.5, 2, Currency(code="EUR")),
        (Order("o1", 10), 2.0, 0, Currency(code="USD")),
    ]
    assert shape(cps) == [
        (0, f"{uid}.charge", "remote", "completed"),
        (1, f"{uid}.charge", "remote", "completed"),
    ]
    assert cps[0].input == {
        ARGS: [{"id": "o1", "amount": 10}, 1.5, 2],
        KWARGS: {"currency": {"code": "EUR"}},
    }
    assert cps[1].input == {
        ARGS: [{"id": "o1", "amount": 10}, 2.0, 0],
        KWARGS: {"currency": {"code": "USD"}},
    }


async def test_sync_step_with_arguments_runs_on_the_engines_thread_pool(
    engine_factory: EngineFactory, uid: str
):
    threads: list[str] = []

    @durably.step(f"{uid}.record")
    def record(invoice: str, rate: float, *lines: int, note: str = "-") -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return {"invoice": invoice, "total": sum(lines) * rate, "note": note}

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.step(record, "inv-1", 0.5, 4, 6, note="paid")

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert out == {"invoice": "inv-1", "total": 5.0, "note": "paid"}
    assert len(threads) == 1 and threads[0].startswith("durably-step")
    assert cps[0].input == {ARGS: ["inv-1", 0.5, 4, 6], KWARGS: {"note": "paid"}}


async def test_a_single_argument_keeps_the_single_input_shape(
    engine_factory: EngineFactory, uid: str
):
    seen: list[Any] = []

    @durably.step(f"{uid}.one")
    def one(value: Any) -> Any:
        seen.append(value)
        return value

    @durably.step(f"{uid}.typed")
    def typed(order: Order) -> int:
        return order.amount

    @durably.step(f"{uid}.none")
    def none() -> str:
        return "none"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[Any]:
        return [
            await ctx.step(one, {"a": 1}),
            await ctx.step(one, 5, retries=2),
            await ctx.step(one, input="kw"),
            await ctx.step(one, (1, 2)),  # a tuple is one input, stored as a list
            await ctx.step(typed, Order("o", 3)),
            await ctx.step(none),
            await ctx.step(f"{uid}.one", "by-name"),
        ]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert out == [{"a": 1}, 5, "kw", [1, 2], 3, "none", "by-name"]
    assert [cp.input for cp in cps] == [
        {"a": 1},
        5,
        "kw",
        [1, 2],
        {"id": "o", "amount": 3},
        None,
        "by-name",
    ]
    assert seen == [{"a": 1}, 5, "kw", [1, 2], "by-name"]


async def test_a_single_input_holding_a_reserved_key_is_refused(
    engine_factory: EngineFactory, uid: str
):
    @durably.step(f"{uid}.one")
    def one(value: Any) -> Any:
        return value

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        try:
            await ctx.step(one, {ARGS: [1], KWARGS: {}})
        except ValueError as exc:
            refused = str(exc)
        # wrapped in Args, the same value is an argument like any other
        wrapped = await ctx.step(one, Args({ARGS: [1], KWARGS: {}}))
        return [refused, wrapped]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        refused, wrapped = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert "'$durably.args'" in refused and "reserved" in refused
    assert wrapped == {ARGS: [1], KWARGS: {}}
    assert [cp.input for cp in cps] == [{ARGS: [{ARGS: [1], KWARGS: {}}], KWARGS: {}}]


async def test_arguments_the_step_cannot_take_are_a_type_error_before_the_position(
    engine_factory: EngineFactory, uid: str
):
    calls: list[Any] = []
    charge = _charge_step(uid, calls)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[str]:
        errors = []
        for bad in (
            lambda: ctx.step(charge, Order("o", 1), 1.0),
            lambda: ctx.step(charge, Order("o", 1), 1.0, 2, 3, currency={"code": "X"}),
            lambda: ctx.step(charge, Order("o", 1), 1.0, 2, currency={}, colour="red"),
            lambda: ctx.all(charge, [Args(Order("o", 1))]),
        ):
            try:
                bad()
            except TypeError as exc:
                errors.append(str(exc))
        errors.append(await ctx.step(charge, Order("o", 1), 1.0, 2, currency=Currency(code="Z")))
        return errors

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert len(out) == 5
    name = f"{uid}.charge"
    assert out[0] == f"ctx.step({name!r}): missing a required argument: 'fee'"
    assert out[1] == f"ctx.step({name!r}): too many positional arguments"
    assert out[2] == f"ctx.step({name!r}): got an unexpected keyword argument 'colour'"
    assert out[3] == f"ctx.all({name!r}) item 0: missing a required argument: 'rate'"
    assert out[4] == "o:3.0Z"
    assert shape(cps) == [(0, name, "remote", "completed")]  # the refused calls claimed nothing
    assert len(calls) == 1


@UNVALIDATED_DICT
async def test_an_argument_failing_validation_fails_the_step_without_retry(
    engine_factory: EngineFactory, uid: str
):
    calls: list[Any] = []
    charge = _charge_step(uid, calls)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        try:
            await ctx.step(
                charge.options(retries=3),
                Order("o", 1),
                1.0,
                2,
                currency={"no": "code"},
            )
        except RemoteStepError as exc:
            return f"{exc.step_error.code}:{'currency' in exc.step_error.message}"
        return "ran"

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert out == "validation:True"  # not retried: the same arguments would fail again
    assert calls == []
    assert [(cp.status, cp.attempts) for cp in cps] == [("failed", 1)]


async def test_options_with_several_arguments(engine_factory: EngineFactory, uid: str):
    attempts: list[tuple[int, int]] = []

    @durably.step(f"{uid}.flaky")
    def flaky(a: int, b: int, *, scale: int = 1) -> int:
        attempts.append((a, b))
        if len(attempts) % 3 != 0:
            raise RuntimeError(f"try {len(attempts)}")
        return (a + b) * scale

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[Any]:
        typed = await ctx.step(flaky.options(retries=3), 1, 2, scale=10)
        # the option keywords are reserved at runtime in every form
        untyped = await ctx.step(flaky, 3, 4, retries=3, scale=2)  # type: ignore[call-arg]
        try:
            ctx.step(flaky.options(retries=2), 1, 2, retries=3)  # type: ignore[call-arg]
        except TypeError as exc:
            conflict = str(exc)
        return [typed, untyped, conflict]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert out[:2] == [30, 14]
    assert "retries given both" in out[2]
    assert [(cp.status, cp.attempts) for cp in cps] == [("completed", 3), ("completed", 3)]
    assert cps[1].input == {ARGS: [3, 4], KWARGS: {"scale": 2}}


async def test_a_parameter_named_like_an_option_is_passed_positionally(
    engine_factory: EngineFactory, uid: str
):
    @durably.step(f"{uid}.fetch")
    def fetch(url: str, timeout: float, retries: int = 0) -> list[Any]:
        return [url, timeout, retries]

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[Any]:
        # positionally they are the step's; as keywords, ctx.step's options
        positional = await ctx.step(fetch.options(timeout="10s"), "u", 2.5, 7)
        try:
            ctx.step(fetch, "u", timeout=2.5)
        except TypeError as exc:
            refused = str(exc)
        return [positional, refused]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        positional, refused = await handle.result(timeout=RESULT_TIMEOUT)

    assert positional == ["u", 2.5, 7]
    assert refused == (
        f"ctx.step('{uid}.fetch'): missing a required argument: 'timeout' ('timeout', "
        "'retries': a ctx.step option keyword, so that parameter is passed positionally)"
    )


@UNVALIDATED_DICT
async def test_fans_over_argument_tuples(engine_factory: EngineFactory, uid: str):
    @durably.step(f"{uid}.mul")
    async def mul(a: int, b: int = 1, *, plus: int = 0) -> int:
        return a * b + plus

    @durably.step(f"{uid}.length")
    def length(item: Any) -> int:
        return len(item)

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[Any]:
        products = await ctx.all(mul, [Args(2, 3), Args(4, plus=1), 5, Args(a=6, b=7)])
        settled = await ctx.all_settled(mul.options(retries=1), [Args(1, 2), Args("x", 2)])
        lengths = await ctx.all(length, [(1, 2, 3), [1]])  # a tuple item is ONE input
        try:
            await ctx.all(child, [Args(1)])
        except TypeError as exc:
            refused = str(exc)
        return [products, [type(s).__name__ for s in settled], lengths, refused]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        products, settled, lengths, refused = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert products == [6, 5, 5, 42]
    assert settled == ["Fulfilled", "Rejected"]  # "x" fails the validation of `a: int`
    assert lengths == [3, 1]
    assert "a workflow takes one input" in refused
    assert [cp.input for cp in cps[:4]] == [
        {ARGS: [2, 3], KWARGS: {}},
        {ARGS: [4], KWARGS: {"plus": 1}},
        5,
        {ARGS: [], KWARGS: {"a": 6, "b": 7}},
    ]
    assert [cp.input for cp in cps[6:8]] == [[1, 2, 3], [1]]


@UNVALIDATED_DICT
async def test_steps_with_arguments_are_not_run_again_after_a_restart(
    engine_factory: EngineFactory, uid: str
):
    calls: list[Any] = []
    charge = _charge_step(uid, calls)
    token = f"{uid}.go"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, order: Order) -> list[Any]:
        first = await ctx.step(charge, order, 1.0, 1, currency=Currency(code="EUR"))
        fanned = await ctx.all(charge, [Args(order, 2.0, 0, currency={"code": "USD"})])
        await ctx.wait_for_signal(token)
        last = await ctx.step(charge, order, 3.0, 0, currency=Currency(code="GBP"))
        return [first, *fanned, last]

    async with engine_factory() as engine:
        handle = await engine.start(wf, Order("o", 2))
        await wait_waiting_on(engine, handle.run_id, token)
        before = await engine.list_checkpoints(handle.run_id)
    assert len(calls) == 2
    async with engine_factory() as engine:
        await engine.signal(token, None)
        out = await engine.get_handle(handle.run_id).result(timeout=RESULT_TIMEOUT)
        after = await engine.list_checkpoints(handle.run_id)

    assert out == ["o:3.0EUR", "o:4.0USD", "o:6.0GBP"]
    assert [c[3] for c in calls] == [Currency(code=c) for c in ("EUR", "USD", "GBP")]
    # the checkpoints written before the restart are read back unchanged
    assert [(cp.seq, cp.input, cp.output) for cp in after[:2]] == [
        (cp.seq, cp.input, cp.output) for cp in before[:2]
    ]
    assert after[1].input == {
        ARGS: [{"id": "o", "amount": 2}, 2.0, 0],
        KWARGS: {"currency": {"code": "USD"}},
    }


def test_args_is_a_plain_value() -> None:
    assert Args(1, b=2) == Args(1, b=2)
    assert Args(1) != Args(1, b=2)
    assert repr(Args(1, "x", b=2)) == "durably.Args(1, 'x', b=2)"
    with pytest.raises(TypeError):
        hash(Args(1))


async def test_a_retry_policy_rides_with_several_arguments(engine_factory: EngineFactory, uid: str):
    """`retry=RetryPolicy(...)` is one of the reserved options: given through `.options(...)`
    or straight to `ctx.step`, it governs a call that passes several arguments."""
    attempts: list[int] = []

    @durably.step(f"{uid}.flaky")
    async def flaky(a: int, b: int, *, c: int) -> int:
        attempts.append(a)
        if len(attempts) < 3:
            raise ConnectionError("not yet")
        return a + b + c

    policy = durably.RetryPolicy(max_attempts=3, retry_on=(ConnectionError,))

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, n: int) -> int:
        return await ctx.step(flaky.options(retry=policy), n, 2, c=3)

    async with engine_factory() as engine:
        handle = await engine.start(wf, 1)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 6
        cps = await engine.list_checkpoints(handle.run_id)
    assert len(attempts) == 3
    (step,) = [cp for cp in cps if cp.name == f"{uid}.flaky"]
    assert [e.attempt for e in step.attempt_errors] == [1, 2]
