"""The workload of test_dead_letter_kill.py, run as a separate process.

`python dead_letter_app.py STORE_URL LOG` drives run `parent`, whose child `poison` runs a
step that kills its own process (SIGKILL) on every attempt. The test restarts the process
each time it dies. Once crash recovery gives up on `poison` (`max_recovery_attempts`), the
process waits for `parent` and the dead-letter run `dlq:poison`, prints them as one JSON
line and exits 0.

Every step attempt and every dead-letter handler run appends one line to LOG with a single
O_APPEND write, which survives the kill.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

import durably
from durably import WorkflowCtx

URL, LOG = sys.argv[1], sys.argv[2]
CAP = int(os.environ.get("DL_CAP", "2"))
LOOP: asyncio.AbstractEventLoop | None = None
ENGINE: durably.Engine | None = None


def _log(line: str) -> None:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


async def _parent_waits() -> None:
    """Until the parent is parked on its child: killed mid-turn, it would be recovered (and
    counted) too, and this test is about the child."""
    assert ENGINE is not None
    while True:
        run = await ENGINE.get_run("parent")
        if run is not None and run.status == "suspended":
            return
        await asyncio.sleep(0.01)


@durably.step("dlk.poison_step")
def poison_step(x: int) -> int:
    _log("attempt")
    assert LOOP is not None
    asyncio.run_coroutine_threadsafe(_parent_waits(), LOOP).result(timeout=60)
    os.kill(os.getpid(), signal.SIGKILL)
    return x


@durably.workflow("dlk.handler")
async def handler(ctx: WorkflowCtx, dead: dict[str, Any]) -> dict[str, Any]:
    await ctx.local_step("log", lambda _log_: _log(f"handled {dead['deadRunId']}"))
    return dead


@durably.workflow("dlk.poison", dead_letter=handler)
async def poison(ctx: WorkflowCtx, x: int) -> int:
    return await ctx.step(poison_step, x)


@durably.workflow("dlk.parent")
async def parent(ctx: WorkflowCtx) -> dict[str, Any]:
    try:
        await ctx.child(poison, 1, id="poison")
    except Exception as exc:
        return {"childFailed": str(exc)}
    return {"childFailed": None}


async def main() -> None:
    global LOOP, ENGINE
    LOOP = asyncio.get_running_loop()
    engine = ENGINE = durably.Engine(
        URL,
        workflows=[handler, poison, parent],
        steps=[poison_step],
        instance_id="dl-worker",  # the same id each life: its runs are taken back at once
        max_recovery_attempts=CAP,
        lease_ms=1500,
        timer_poll_ms=50,
    )
    async with engine:
        await engine.start(parent, None, run_id="parent")
        done = await engine.wait_for_run("parent", timeout=90, until="terminal")
        dlq = await engine.wait_for_run("dlq:poison", timeout=90, until="terminal")
        dead = await engine.get_run("poison")
        assert dead is not None
        print(
            json.dumps(
                {
                    "parent": {"status": done.status, "output": done.output},
                    "dead": {
                        "status": dead.status,
                        "recoveryAttempts": dead.recovery_attempts,
                        "error": dead.error.to_json() if dead.error else None,
                    },
                    "dlq": {"status": dlq.status, "workflow": dlq.workflow, "input": dlq.input},
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main())
