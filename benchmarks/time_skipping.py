"""Time skipping: how much wall time a test environment spends on a month of waiting.

One workflow sleeps 30 days, waits 7 days for a signal that never comes and runs a step that
fails five times with exponential back-off (1, 2, 4, 8 and 16 minutes): 37 days and 31
minutes of workflow time. Each repetition opens a `durably.testing.WorkflowEnvironment` on the
store, runs the workflow once and closes it. Prints one JSON line per store: ``wall_ms_median``
and ``wall_ms_max`` of the run alone (the environment's opening and closing apart),
``open_ms_median``, ``jumps_median`` (clock jumps per run), ``workflow_days`` and the common
fields of ``bench_common``. Usage::

    python benchmarks/time_skipping.py [--reps 20] [--stores memory sqlite postgresql://…]

A store is ``memory``, ``sqlite`` (a temporary file per repetition) or a store URL (the runs
stay in that database).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common

import durably
from durably import WorkflowCtx
from durably.testing import WorkflowEnvironment

DAY_MS = 86_400_000
_attempts: dict[str, int] = {}


@durably.step("bench.skip.flaky", retries=6, backoff="exponential", backoff_ms="1m")
async def flaky(key: str) -> int:
    _attempts[key] = _attempts.get(key, 0) + 1
    if _attempts[key] <= 5:
        raise RuntimeError("not yet")
    return _attempts[key]


@durably.workflow("bench.skip.month")
async def month(ctx: WorkflowCtx, key: str) -> int:
    await ctx.sleep("30d")
    try:
        await ctx.wait_for_signal(f"bench-skip:{key}", timeout="7d")
    except durably.SignalTimeoutError:
        pass
    return await ctx.step(flaky, key)


async def _one(store: str) -> dict[str, float]:
    opened = time.perf_counter()
    async with WorkflowEnvironment(workflows=[month], steps=[flaky], store=store) as env:
        began_ms, began = env.clock.now(), time.perf_counter()
        open_ms = (began - opened) * 1000
        assert await env.run(month, uuid.uuid4().hex) == 6
        wall_ms = (time.perf_counter() - began) * 1000
        skipper = env._skipper  # what the benchmark measures
        jumps = skipper.jumps if skipper is not None else 0
        days = (env.clock.now() - began_ms) / DAY_MS
    return {"wall_ms": wall_ms, "open_ms": open_ms, "jumps": jumps, "days": days}


async def _measure(store: str, url: str, reps: int) -> dict[str, Any]:
    report = bench_common.new_report("durably", durably.__version__, store, "time_skipping", reps)
    try:
        runs = [await _one(url) for _ in range(reps)]
        walls = [r["wall_ms"] for r in runs]
        report.update(
            wall_ms_median=round(statistics.median(walls), 2),
            wall_ms_max=round(max(walls), 2),
            open_ms_median=round(statistics.median(r["open_ms"] for r in runs), 2),
            jumps_median=statistics.median(r["jumps"] for r in runs),
            workflow_days=round(runs[0]["days"], 3),
            ok=True,
        )
    except Exception as exc:
        bench_common.record_error(report, exc)
    return bench_common.finish_report(report)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--stores", nargs="+", default=["memory", "sqlite"])
    args = parser.parse_args()
    for store in args.stores:
        backend = store if store in ("memory", "sqlite") else store.partition(":")[0]
        print(json.dumps(await _measure(backend, store, args.reps)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
