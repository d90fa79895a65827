"""The workload of the crash tests (run as a separate process by test_crash_sqlite.py).

`python crash_app.py DB LOG start N` starts N runs of `crash_wf` and drives them;
`python crash_app.py DB LOG recover N` drives whatever is in the store until the N runs are
terminal, then prints one JSON line with their outputs.

Each step appends `<run_id> <i>` to LOG with one O_APPEND write (which survives SIGKILL),
before doing anything else; when CRASH_BLOCK_STEP=i, step i then blocks so the parent test
can kill the process inside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import durably
from durably import WorkflowCtx

LOG = sys.argv[2] if len(sys.argv) > 2 else os.devnull
BLOCK_STEP = int(os.environ.get("CRASH_BLOCK_STEP", "0"))


@durably.step("crash.step")
def crash_step(arg: dict[str, int | str]) -> int:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{arg['run']} {arg['i']}\n".encode())
    finally:
        os.close(fd)
    if arg["i"] == BLOCK_STEP:
        time.sleep(60)  # the parent kills us in here
    return int(arg["x"]) + 1


@durably.workflow("crash.wf")
async def crash_wf(ctx: WorkflowCtx, steps: int) -> int:
    x = 0
    for i in range(1, steps + 1):
        x = await ctx.step(crash_step, {"run": ctx.run_id, "i": i, "x": x})
    return x


async def main() -> None:
    db, _log, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    instance = os.environ.get("CRASH_INSTANCE_ID") or None
    lease_ms = int(os.environ.get("CRASH_LEASE_MS", "1500"))
    engine = durably.Engine(
        store=f"sqlite:///{db}",
        workflows=[crash_wf],
        steps=[crash_step],
        instance_id=instance,
        lease_ms=lease_ms,
        timer_poll_ms=100,
    )
    async with engine:
        ids = [f"crash-{i}" for i in range(n)]
        if mode == "start":
            for run_id in ids:
                await engine.start(crash_wf, 10, run_id=run_id)
            print("STARTED", flush=True)
            await asyncio.sleep(3600)
        results = {}
        for run_id in ids:
            run = await engine.wait_for_run(run_id, timeout=60, until="terminal")
            results[run_id] = {"status": run.status, "output": run.output}
        print(json.dumps(results), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
