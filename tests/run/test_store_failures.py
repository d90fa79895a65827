"""A store that fails under a running turn (developers' guide: "a store that went away").

The failure is injected into the real in-memory store (its method raises once, as a lost
connection would); the run must not act on undurable state — a body's `except Exception`
cannot swallow the failure — and it resumes from its last checkpoint once the store is back.
"""

from __future__ import annotations

from typing import Any

import durably
from durably import InMemoryStateStore, StepCheckpoint, WorkflowCtx


class StoreWentAway(ConnectionError):
    pass


class FailingOnce(InMemoryStateStore):
    """The reference store, failing the N-th checkpoint write once."""

    def __init__(self, fail_on_write: int):
        super().__init__()
        self.writes = 0
        self.fail_on_write = fail_on_write

    async def save_checkpoint(self, cp: StepCheckpoint) -> None:
        self.writes += 1
        if self.writes == self.fail_on_write:
            raise StoreWentAway("database connection lost")
        await super().save_checkpoint(cp)


async def test_store_failure_ends_the_turn_and_the_run_recovers(uid: str) -> None:
    calls: dict[int, int] = {}

    @durably.step(f"{uid}.work")
    async def work(i: int) -> int:
        calls[i] = calls.get(i, 0) + 1
        return i * 10

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        total = 0
        for i in range(5):
            try:
                total += await ctx.step(work, i)
            except Exception:  # must not swallow the store failure
                return "swallowed"
        return total

    store = FailingOnce(fail_on_write=3)  # the checkpoint of step i=2
    async with durably.Engine(
        store=store, workflows=[wf], lease_ms=300, timer_poll_ms=20
    ) as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        assert await handle.result(timeout=10) == sum(i * 10 for i in range(5))
        run = await engine.get_run(handle.run_id)
    assert run is not None and run.recovery_attempts == 1
    # steps whose checkpoint committed ran once; the one whose write failed ran again
    assert calls == {0: 1, 1: 1, 2: 2, 3: 1, 4: 1}
