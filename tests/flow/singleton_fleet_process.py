"""One engine process of the singleton fleet test (tests/flow/test_singleton_fleet.py).

`python -m tests.flow.singleton_fleet_process URL EFFECTS` runs an engine on the PostgreSQL
store at URL until SIGTERM. Runs of `fleet.exclusive` are singletons by their input's `key`;
each appends two lines to the file EFFECTS (small appends to a file opened for appending are
atomic, so processes never interleave inside a line):

- `enter <run_id> <key> <at> <pid>`: its first step ran (epoch s);
- `leave <run_id> <key> <at> <pid>`: its last step ran, after a durable sleep in between
  (the run is suspended meanwhile and still holds its key).

It prints `ready` once the engine is open.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

import durably
from durably import Singleton, WorkflowCtx

_effects = ""


def _note(line: str) -> None:
    with open(_effects, "a") as out:
        out.write(line + "\n")


@durably.step("fleet.enter")
async def enter(what: list[str]) -> None:
    _note(f"enter {what[0]} {what[1]} {time.time():.6f} {os.getpid()}")
    await asyncio.sleep(0.02)


@durably.step("fleet.leave")
async def leave(what: list[str]) -> None:
    await asyncio.sleep(0.02)
    _note(f"leave {what[0]} {what[1]} {time.time():.6f} {os.getpid()}")


@durably.workflow("fleet.exclusive", singleton=Singleton(key=lambda i: i["key"]))
async def exclusive(ctx: WorkflowCtx, inp: dict[str, Any]) -> str:
    await ctx.step(enter, [ctx.run_id, inp["key"]])
    await ctx.sleep("30ms")
    await ctx.step(leave, [ctx.run_id, inp["key"]])
    return str(inp["key"])


async def main(url: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with durably.Engine(
        url,
        workflows=[exclusive],
        steps=[enter, leave],
        timer_poll_ms=50,
        lease_ms=3000,
        claim_batch=2,
        drain_timeout_ms=1000,
    ):
        print("ready", flush=True)
        await stop.wait()


if __name__ == "__main__":
    _effects = sys.argv[2]
    asyncio.run(main(sys.argv[1]))
