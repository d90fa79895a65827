"""Checked by `mypy --strict` in test_step_args_typing.py: `ctx.step(step, *args, **kwargs)`
is checked against the step's own parameters, and the single-input form keeps its option
keywords. Each line carrying a mypy-error mark must be reported with the text after the
mark; no other line may be."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, assert_type

import durably
from durably import Step, WorkflowCtx


@dataclass
class Order:
    id: str
    amount: int


@durably.step("args.charge")
async def charge(order: Order, rate: float, fee: int, *, currency: str = "USD") -> str:
    return f"{order.id}:{order.amount * rate + fee}{currency}"


@durably.step("args.record")
def record(invoice: str, rate: float) -> int:
    return len(invoice) + int(rate)


@durably.step("args.count")
def count(text: str) -> int:
    return len(text)


@durably.step("args.ping")
async def ping() -> bool:
    return True


@durably.step("args.scaled")
async def scaled(amount: int, factor: int = 2) -> int:
    return amount * factor


@durably.workflow("args.accepted")
async def accepted(ctx: WorkflowCtx, order: Order) -> int:
    receipt = await ctx.step(charge, order, 1.5, 2, currency="EUR")
    assert_type(receipt, str)
    assert_type(await ctx.step(charge, order, 1.0, 0), str)
    assert_type(await ctx.step(record, receipt, 0.5), int)
    assert_type(await ctx.step(record, receipt, rate=0.5), int)
    assert_type(await ctx.step(charge.options(retries=3, timeout="5s"), order, 1.0, 2), str)
    assert_type(await ctx.step(scaled, 3), int)
    assert_type(await ctx.step(scaled, 3, 4), int)
    assert_type(await ctx.step(scaled, 3, factor=4), int)
    # The single-input form with every option keyword, as before steps took arguments.
    n = await ctx.step(
        count,
        receipt,
        retries=3,
        backoff="exponential",
        backoff_ms="100ms",
        backoff_max_ms=2,
        jitter=True,
        timeout="30s",
        queue="q",
        priority=1,
        fairness_key="k",
        compensate=record,
    )
    assert_type(n, int)
    assert_type(await ctx.step(count, input=receipt, retries=2), int)
    assert_type(await ctx.step(ping), bool)
    assert_type(await ctx.step(ping, retries=2), bool)
    assert_type(await ctx.step("args.by-name", 1, 2, currency="EUR"), Any)
    assert_type(await ctx.step("args.by-name", {"a": 1}, retries=2), Any)
    fanned = await ctx.all(record, [durably.Args("a", 1.0), durably.Args("b", rate=2.0)])
    assert_type(fanned, list[int])
    return n


# A decorated step is still a `Step` of its first input and its output...
charge_step: Step[Order, str] = charge
count_step: Step[str, int] = count


@durably.workflow("args.rejected")
async def rejected(ctx: WorkflowCtx, o: Order) -> None:
    await ctx.step(charge, o, "1.5", 2, currency="EUR")  # mypy-error: "str"; expected "float"
    await ctx.step(charge, o, "1.5", 2)  # mypy-error: No overload variant of "step"
    await ctx.step(charge, o, 1.5, 2, currency=978)  # mypy-error: type "int"; expected "str"
    await ctx.step(charge, o)  # mypy-error: Argument 1 to "step" of "WorkflowCtx" has
    await ctx.step(record, "inv", 0.5, extra=1)  # mypy-error: keyword argument "extra"
    await ctx.step(record, "inv", 0.5, retries=3)  # mypy-error: keyword argument "retries"
    await ctx.step(count, 42)  # mypy-error: Cannot infer value of type parameter
    await charge(o, "fast", 2)  # mypy-error: incompatible type "str"; expected "float"


# A handler taking the step logger after its one input: called with the input alone.
@durably.step("args.logged")
async def logged(order: Order, log: durably.StepContext) -> int:
    log.info("charging", {"id": order.id})
    return order.amount


@durably.step("args.logged_sync")
def logged_sync(n: int, log: durably.StepContext) -> str:
    return str(n)


async def logged_calls(ctx: WorkflowCtx, o: Order) -> None:
    assert_type(await ctx.step(logged, o), int)
    assert_type(await ctx.step(logged, o, retries=2), int)
    assert_type(await ctx.step(logged_sync, 3), str)
    await ctx.step(logged, "o-1")  # mypy-error: Cannot infer value of type parameter
