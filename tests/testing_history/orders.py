"""The ten-step workflow the replay tests record and replay, in the variants a code change
makes of it: the same code, a step inserted before the end (with or without `ctx.patched`),
a step appended after the last one, and one that waits for a signal after its steps."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import durably

_ids = itertools.count()

STEPS = 10


@dataclass
class Orders:
    """One declaration of the workflow: `workflow`, its steps, and the calls its step
    bodies received (a replay must leave `calls` empty)."""

    name: str
    workflow: durably.Workflow[Any, Any]
    steps: list[durably.Step[Any, Any]]
    calls: list[tuple[str, int]] = field(default_factory=list)


def orders(
    name: str | None = None,
    *,
    insert_at: int | None = None,
    patched: bool = False,
    append: bool = False,
    wait_signal: bool = False,
) -> Orders:
    """The workflow `name` (a fresh one when None): `STEPS` calls of `work`, their outputs
    summed. `insert_at`: an `audit` step before call `insert_at` (behind
    `ctx.patched("audit")` when `patched`); `append`: an `audit` step after the last call;
    `wait_signal`: then waits for the signal `<run id>:go`."""
    wf_name = name or f"orders-{next(_ids)}"
    calls: list[tuple[str, int]] = []

    @durably.step(f"{wf_name}.work")
    async def work(i: int) -> int:
        calls.append(("work", i))
        return i * 10

    @durably.step(f"{wf_name}.audit")
    async def audit(i: int) -> str:
        calls.append(("audit", i))
        return f"audited {i}"

    @durably.workflow(wf_name)
    async def wf(ctx: durably.WorkflowCtx, n: int) -> int:
        total = 0
        for i in range(n):
            if i == insert_at and (not patched or await ctx.patched("audit")):
                await ctx.step(audit, i)
            total += await ctx.step(work, i)
        if append:
            await ctx.step(audit, n)
        if wait_signal:
            await ctx.wait_for_signal(f"{ctx.run_id}:go")
        return total

    return Orders(wf_name, wf, [work, audit], calls)
