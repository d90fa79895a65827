"""One engine process of the flow-control fleet tests.

`python -m tests.flow.fleet_process URL EFFECTS NAMESPACE [REDIS_PREFIX]` runs an engine on
the PostgreSQL store at URL until SIGTERM. Its slots are counted in the store, or — given
REDIS_PREFIX — on the tests' Redis server under that key prefix (`RedisAdmission`); either
way every process of the fleet shares them. Its steps append one line per side effect to
the file EFFECTS (small appends to a file opened for appending are atomic, so processes never
interleave inside a line):

- `span <label> <start> <end> <pid>`: a step of queue `api` ran from start to end (epoch s);
- `hog <at> <pid>`: the step that holds queue `solo` forever started;
- `next <at> <pid>`: the step waiting behind it on `solo` started.

It prints `ready` once the engine is open.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import durably
from durably import Queue, WorkflowCtx
from durably._engine.flow.queues import AdmissionSpec
from tests.remote.redis_support import REDIS_URL

# Short TTLs so a SIGKILLed process's slots lapse within the test.
QUEUES = [
    Queue("api", concurrency=5, retry=0.25, slot_ttl=2.0),
    Queue("solo", concurrency=1, retry=0.2, slot_ttl=2.0),
]

STEP_S = 0.01  # how long a step of queue `api` runs

_effects = ""


def _note(line: str) -> None:
    with open(_effects, "a") as out:
        out.write(line + "\n")


@durably.step("fleet.call")
async def call(label: str) -> str:
    start = time.time()
    await asyncio.sleep(STEP_S)
    _note(f"span {label} {start:.6f} {time.time():.6f} {os.getpid()}")
    return label


@durably.workflow("fleet.batch")
async def batch(ctx: WorkflowCtx, n: int) -> int:
    steps = [ctx.step(call, f"{ctx.run_id}.{i}", queue="api") for i in range(n)]
    return len(await asyncio.gather(*steps))


@durably.step("fleet.hog")
async def hog() -> str:
    _note(f"hog {time.time():.6f} {os.getpid()}")
    await asyncio.sleep(3600)
    return "never"


@durably.workflow("fleet.hogger")
async def hogger(ctx: WorkflowCtx) -> str:
    return await ctx.step(hog, queue="solo")


@durably.step("fleet.next")
async def follow() -> str:
    _note(f"next {time.time():.6f} {os.getpid()}")
    return "next"


@durably.workflow("fleet.follower")
async def follower(ctx: WorkflowCtx) -> str:
    return await ctx.step(follow, queue="solo")


async def main(url: str, namespace: str, redis_prefix: str | None) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    admission: AdmissionSpec = "store"
    if redis_prefix is not None:
        from durably._transport.redis_admission import RedisAdmission

        admission = RedisAdmission(REDIS_URL, prefix=redis_prefix)
    async with durably.Engine(
        url,
        namespace=namespace,
        workflows=[batch, hogger, follower],
        steps=[call, hog, follow],
        queues=QUEUES,
        admission=admission,
        timer_poll_ms=50,
        lease_ms=3000,
        claim_batch=2,
        max_concurrent_runs=6,
        drain_timeout_ms=1000,
    ):
        print("ready", flush=True)
        await stop.wait()


if __name__ == "__main__":
    _effects = sys.argv[2]
    asyncio.run(main(sys.argv[1], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None))
