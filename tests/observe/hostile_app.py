"""Workflows whose names and error codes hold the characters the Prometheus text format must
escape (`"`, `\\`, a newline): what the metrics tests run, in-process and in a worker."""

from __future__ import annotations

import durably
from durably import WorkflowCtx

#: A workflow name and an error code no hand-written exposition gets right.
NAME = 'pay"ments\\east\nline'
CODE = 'card"declined\\x\ny'
STEP = 'charge"\\\n'


class Declined(Exception):
    code = CODE


@durably.step(STEP, retries=2, backoff_ms=10)
async def charge(x: int) -> int:
    if x < 0:
        raise Declined(f"declined {x}")
    return x * 2


@durably.workflow(NAME)
async def payments(ctx: WorkflowCtx, x: int) -> int:
    return await ctx.step(charge, x)


@durably.workflow(NAME + ".wait")
async def waits(ctx: WorkflowCtx) -> str:
    value: str = await ctx.wait_for_signal("never")
    return value


WORKFLOWS = [payments, waits]
