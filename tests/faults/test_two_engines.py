"""Two engines racing on one SQLite file: leases keep each run to one driver at a time.

Each engine has its own store object (its own writer connection), as two processes would;
they contend through SQLite's locking. Checked: no run executes on two engines at once, a
long step whose lease is renewed is never taken over, and every step runs exactly once.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import durably
from durably import WorkflowCtx

RUNS = 60
STEPS = 5


async def test_two_engines_share_the_work_and_run_every_step_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'race.db'}"
    executed: collections.Counter[tuple[str, int]] = collections.Counter()
    owners: dict[str, set[str]] = collections.defaultdict(set)

    @durably.step("race.step")
    async def race_step(arg: list[str | int]) -> int:
        run_id, i, owner = str(arg[0]), int(arg[1]), str(arg[2])
        executed[(run_id, i)] += 1
        owners[run_id].add(owner)
        await asyncio.sleep(0.001)
        return i

    @durably.workflow("race.wf")
    async def race_wf(ctx: WorkflowCtx, n: int) -> int:
        total = 0
        for i in range(n):
            total += await ctx.step(race_step, [ctx.run_id, i, ctx._host.instance_id])
        return total

    tuning = {"workflows": [race_wf], "steps": [race_step], "timer_poll_ms": 10, "lease_ms": 2000}
    async with (
        durably.Engine(store=url, instance_id="engine-a", **tuning) as a,
        durably.Engine(store=url, instance_id="engine-b", **tuning) as b,
        durably.Engine(store=url, drive=False, **tuning) as api,
    ):
        # An API replica enqueues; both driving engines race to pick the runs up.
        handles = [await api.start(race_wf, STEPS, run_id=f"race-{i}") for i in range(RUNS)]
        results = [await h.result(timeout=60) for h in handles]
        runs = [await api.get_run(h.run_id) for h in handles]
        metrics = (a.metrics().runs["completed"], b.metrics().runs["completed"])

    assert results == [sum(range(STEPS))] * RUNS
    assert all(r is not None and r.status == "completed" for r in runs)
    assert all(executed[(f"race-{i}", s)] == 1 for i in range(RUNS) for s in range(STEPS))
    # runs are not migrated mid-flight between two live engines
    assert all(len(owners[f"race-{i}"]) == 1 for i in range(RUNS))
    assert sum(metrics) == RUNS
    print(
        f"checked {RUNS} runs / {RUNS * STEPS} steps; engine-a completed {metrics[0]}, "
        f"engine-b completed {metrics[1]}"
    )


async def test_a_renewed_lease_is_not_taken_over(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lease.db'}"
    calls: list[str] = []
    started = asyncio.Event()

    @durably.step("lease.slow")
    async def slow(owner: str) -> str:
        calls.append(owner)
        started.set()
        await asyncio.sleep(1.2)  # four lease lengths
        return owner

    @durably.workflow("lease.wf")
    async def lease_wf(ctx: WorkflowCtx) -> str:
        return await ctx.step(slow, ctx._host.instance_id)

    tuning = {"workflows": [lease_wf], "steps": [slow], "timer_poll_ms": 10, "lease_ms": 300}
    async with durably.Engine(store=url, instance_id="holder", **tuning) as holder:
        handle = await holder.start(lease_wf, run_id="long")
        await asyncio.wait_for(started.wait(), 10)
        async with durably.Engine(store=url, instance_id="thief", **tuning) as thief:
            assert await handle.result(timeout=10) == "holder"
            assert thief.metrics().runs["started"] == 0
    assert calls == ["holder"]
