"""Checked by `mypy --strict` in test_typing.py: the decorators keep their types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_type

import durably
from durably import RunHandle, WorkflowCtx
from durably._engine.registry import AsyncStep, SyncStep


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


assert_type(charge, AsyncStep[Order, str])
assert_type(count, SyncStep[str, int])
assert_type(checkout, durably.Workflow[Order, int])


async def use(engine: durably.Engine) -> None:
    handle = await engine.start(checkout, Order("o", 1))
    assert_type(handle, RunHandle[int])
    assert_type(await handle.result(), int)
    assert_type(await engine.execute(checkout, Order("o", 2)), int)
    assert_type(await charge(Order("o", 3)), str)  # still a plain callable
    assert_type(count("abc"), int)
