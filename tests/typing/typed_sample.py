"""Checked by `mypy --strict` in test_typing.py: the decorators keep their types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, assert_type

import durably
from durably import RunHandle, Step, WorkflowCtx


@dataclass
class Order:
    id: str
    amount: int


@durably.step("typed.charge")
async def charge(order: Order) -> str:
    return order.id


@durably.step("typed.count")
def count(text: str) -> int:
    return len(text)


@durably.workflow("typed.checkout")
async def checkout(ctx: WorkflowCtx, order: Order) -> int:
    charge_id = await ctx.step(charge, order)
    assert_type(charge_id, str)
    n = await ctx.step(count, charge_id)
    assert_type(n, int)
    return n


# A decorated function is a `Step` of its input and output types...
charge_step: Step[Order, str] = charge
count_step: Step[str, int] = count
assert_type(checkout, durably.Workflow[Order, int])


async def _misuse() -> None:
    # ...and of exactly those: were either type lost (Any), these ignores would be unused,
    # which `--strict` reports.
    await charge("not an order")  # type: ignore[arg-type]
    count(42)  # type: ignore[arg-type]


async def use(engine: durably.Engine) -> None:
    handle = await engine.start(checkout, Order("o", 1))
    assert_type(handle, RunHandle[int])
    assert_type(await handle.result(), int)
    assert_type(await engine.execute(checkout, Order("o", 2)), int)
    # By name: `output_type=` says what the result is; without it, Any.
    by_type = await engine.start("checkout", Order("o", 4), output_type=Order)
    assert_type(by_type, RunHandle[Order])
    assert_type(await by_type.result(), Order)
    assert_type(await engine.start("checkout", None), RunHandle[Any])
    assert_type(await charge(Order("o", 3)), str)  # still a plain callable
    assert_type(count("abc"), int)
