"""The workload of tests/faults/test_remote_faults.py: one remote step, a workflow calling it,
a step worker (`durably worker tests.faults.remote_fault_app:worker_app`) and an engine
process to kill (`python -m tests.faults.remote_fault_app engine STORE_URL N`).

Settings come from the environment, so the test process, the workers and the engine
processes build the same transport:

* FAULT_TRANSPORT — `redis` or `sql`; FAULT_URL — the broker (a Redis or PostgreSQL URL);
  FAULT_PREFIX — the transport's key or table prefix (one per test);
* FAULT_LOG — the side-effect log: the step appends `<run_id> <seq> <pid>` with ONE
  `os.write` on an O_APPEND descriptor before anything else (a line written before a
  SIGKILL survives it; lines of concurrent processes never tear);
* FAULT_STEP_SLEEP — how long the step then sleeps (seconds), in the worker process that runs
  it (a first worker that is to be killed mid-step sleeps long, the second one not).

The broker timings are short so that a dead worker's task comes back within seconds: BullMQ
locks of 2 s checked for stalls every 0.5 s, SQL claims leased for `SQL_LEASE_MS`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import durably
from durably import WorkflowCtx
from durably.transports import Transport

STEP = "fault.remote.work"
WORKFLOW = "fault.remote.wf"
LOCK_MS = 2_000
STALL_MS = 500
SQL_LEASE_MS = 2_000
#: The engine process's run lease: a killed engine's runs are recovered this long after.
ENGINE_LEASE_MS = 1_500


def make_transport(instance_id: str | None = None) -> Transport:
    kind, url, prefix = (os.environ[k] for k in ("FAULT_TRANSPORT", "FAULT_URL", "FAULT_PREFIX"))
    if kind == "redis":
        from durably._transport.redis import WorkerTiming
        from durably.transports import RedisTransport

        timing = WorkerTiming(lock_duration_ms=LOCK_MS, stalled_interval_ms=STALL_MS)
        return RedisTransport(url, prefix=prefix, timing=timing, instance_id=instance_id)
    if kind == "sql":
        from durably.transports import SqlTransport

        return SqlTransport(
            url,
            prefix=prefix,
            poll_ms=50,
            lease_ms=SQL_LEASE_MS,
            pool_size=2,
            instance_id=instance_id,
        )
    raise ValueError(f"FAULT_TRANSPORT must be redis or sql, not {kind!r}")


def _effect(line: str) -> None:
    fd = os.open(os.environ["FAULT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@durably.step(STEP)
async def work(data: dict[str, Any]) -> dict[str, Any]:
    _effect(f"{data['run']} {data['seq']} {os.getpid()}")
    await asyncio.sleep(float(os.environ.get("FAULT_STEP_SLEEP", "0")))
    return {"x": data["x"] * 10 + data["seq"], "pid": os.getpid()}


@durably.workflow(WORKFLOW)
async def wf(ctx: WorkflowCtx, job: dict[str, int]) -> list[dict[str, Any]]:
    """`job["steps"]` remote steps, one after the other; their outputs."""
    # Retries: a dispatch refused while the broker restarts fails the attempt (retryable).
    return [
        await ctx.step(
            work, {"run": ctx.run_id, "seq": i, "x": job["x"]}, retries=20, backoff_ms="200ms"
        )
        for i in range(job["steps"])
    ]


def gate_token(run_id: str) -> str:
    return f"gate-{run_id}"


@durably.workflow("fault.remote.gated")
async def gated(ctx: WorkflowCtx, x: int) -> dict[str, Any]:
    """One remote step, then a wait for a signal: a run that stays open after its step."""
    out: dict[str, Any] = await ctx.step(work, {"run": ctx.run_id, "seq": 0, "x": x})
    await ctx.wait_for_signal(gate_token(ctx.run_id))
    return out


def expected_output(x: int, steps: int) -> list[int]:
    """The `x` of each step's output for a run of `wf` (pids vary)."""
    return [x * 10 + i for i in range(steps)]


def worker_app() -> durably.Engine:
    """A pure step worker (no workflows, an in-memory store) serving `work`."""
    return durably.Engine("memory", transport=make_transport(), role="worker", steps=[work])


def engine(store: str, instance_id: str, **options: Any) -> durably.Engine:
    """An orchestrator on `store`: it drives `wf`, every step runs on the workers."""
    return durably.Engine(
        store,
        transport=make_transport(instance_id),
        workflows=[wf],
        steps=[],
        instance_id=instance_id,
        **options,
    )


def engine_serving_steps(store: str, instance_id: str) -> durably.Engine:
    """An engine that drives the workflows and serves `work` itself, over the transport."""
    return durably.Engine(
        store,
        transport=make_transport(instance_id),
        workflows=[wf, gated],
        steps=[work],
        instance_id=instance_id,
        timer_poll_ms=50,
    )


async def _start_and_hang(store: str, n: int, steps: int) -> None:
    app = engine(store, f"engine-a-{os.getpid()}", lease_ms=ENGINE_LEASE_MS, timer_poll_ms=50)
    async with app:
        for i in range(n):
            await app.start(wf, {"x": i, "steps": steps}, run_id=f"rf-{i}")
        print("STARTED", flush=True)
        await asyncio.Event().wait()  # until the test kills this process


if __name__ == "__main__":
    if sys.argv[1:2] != ["engine"] or len(sys.argv) != 5:
        raise SystemExit("usage: python -m tests.faults.remote_fault_app engine STORE N STEPS")
    asyncio.run(_start_and_hang(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
