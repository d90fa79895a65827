"""The worker process of the PostgreSQL fault suite (run as `python fault_app.py URL LOG`).

It drives every run of `fault.wf` it finds in the database until it receives SIGTERM, which
it handles like `durably worker` does: `await engine.close()` (drain), then exit 0.

Side-effect log (LOG): every line is ONE `os.write` on an O_APPEND descriptor, so lines of
concurrent processes never tear and a line written before a SIGKILL survives it.

* `<run> <step> effect <pid>` — the step's side effect, first thing in the step body;
* `<run> <seq> committed <pid>` — written right after the store's `save_checkpoint` of that
  step's completed checkpoint returned (the checkpoint is durable);
* `<run> <seq> failed <pid> <error>` — that `save_checkpoint` raised (say, the server went
  away): the checkpoint may or may not have committed;
* `<run> <seq> kill <pid> <boundary>` — this process is about to SIGKILL itself.

Self-kill at the K-th occurrence of a boundary (`FAULT_KILL=<boundary>:<K>`):

* `before-step`   — on the `step.started` engine event, before the step body runs;
* `in-step`       — inside the step body, after its effect line;
* `before-commit` — in the store, after the side effect, before the checkpoint is written;
* `after-commit`  — in the store, after the checkpoint committed and its line was written,
  before the next step starts.

Other settings (environment): FAULT_INSTANCE (instance_id), FAULT_LEASE_MS, FAULT_POLL_MS,
FAULT_DB_LATENCY_MS (extra latency before every store call),
FAULT_STEP_MS (how long a step body sleeps after its effect, ±50 %), FAULT_MAX_CONCURRENT
(max_concurrent_runs), FAULT_DRAIN_MS (drain_timeout_ms), FAULT_START_AT (wall-clock epoch
seconds to wait for before opening the engine, so two processes start at the same moment).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import durably
from durably import EngineEvent, StepCheckpoint, WorkflowCtx
from durably._store.sql import SqlStateStore

STEP_NAME = "fault.step"
BOUNDARIES = ("before-step", "in-step", "before-commit", "after-commit")

PID = os.getpid()
_LOG_FD = -1


def log_line(line: str) -> None:
    os.write(_LOG_FD, (line + "\n").encode())


class Killer:
    """SIGKILL this process at the K-th occurrence of one boundary (thread-safe)."""

    def __init__(self, spec: str) -> None:
        self.boundary, self.k = "", 0
        if spec:
            boundary, _, k = spec.partition(":")
            if boundary not in BOUNDARIES:
                raise SystemExit(f"unknown boundary {boundary!r}")
            self.boundary, self.k = boundary, int(k)
        self._count = 0
        self._lock = threading.Lock()

    def hit(self, boundary: str, run_id: str, seq: int) -> None:
        if boundary != self.boundary:
            return
        with self._lock:
            self._count += 1
            if self._count != self.k:
                return
            log_line(f"{run_id} {seq} kill {PID} {boundary}")
            os.kill(PID, signal.SIGKILL)
            time.sleep(60)  # never reached: SIGKILL cannot be caught


KILLER = Killer(os.environ.get("FAULT_KILL", ""))
STEP_MS = int(os.environ.get("FAULT_STEP_MS", "0"))


@durably.step(STEP_NAME)
async def fault_step(arg: dict[str, Any]) -> int:
    run_id, i = str(arg["run"]), int(arg["i"])
    log_line(f"{run_id} {i} effect {PID}")
    KILLER.hit("in-step", run_id, i)
    if STEP_MS:
        # jittered, so concurrent runs do not march in lockstep (their checkpoint writes are
        # spread over time, and a short outage always meets some)
        await asyncio.sleep(STEP_MS * random.uniform(0.5, 1.5) / 1000.0)
    return int(arg["x"]) + i + int(arg["salt"])


@durably.workflow("fault.wf")
async def fault_wf(ctx: WorkflowCtx, spec: dict[str, int]) -> int:
    x = 0
    for i in range(spec["steps"]):
        x = await ctx.step(fault_step, {"run": ctx.run_id, "i": i, "x": x, "salt": spec["salt"]})
    return x


def expected_output(steps: int, salt: int) -> int:
    return sum(i + salt for i in range(steps))


DB_LATENCY_S = int(os.environ.get("FAULT_DB_LATENCY_MS", "0")) / 1000.0


class FaultStore(SqlStateStore):
    """The real PostgreSQL store, with the commit of every step checkpoint logged, and with
    `FAULT_DB_LATENCY_MS` of extra latency before every store call (a database a few
    milliseconds away, so timing windows do not depend on how fast the local one is)."""

    async def save_checkpoint(self, cp: StepCheckpoint) -> None:
        tracked = cp.name == STEP_NAME and cp.status == "completed"
        if tracked:
            KILLER.hit("before-commit", cp.run_id, cp.seq)
        try:
            await _SqlSave(self, cp)
        except BaseException as exc:
            if tracked:
                log_line(f"{cp.run_id} {cp.seq} failed {PID} {type(exc).__name__}")
            raise
        if tracked:
            log_line(f"{cp.run_id} {cp.seq} committed {PID}")
            KILLER.hit("after-commit", cp.run_id, cp.seq)


def _with_latency(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def delayed(self: Any, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(DB_LATENCY_S)
        return await method(self, *args, **kwargs)

    return delayed


_SqlSave = SqlStateStore.save_checkpoint
if DB_LATENCY_S:
    _SqlSave = _with_latency(_SqlSave)
    for _name, _method in inspect.getmembers(SqlStateStore, inspect.iscoroutinefunction):
        if not _name.startswith("_") and _name not in ("save_checkpoint", "close"):
            setattr(FaultStore, _name, _with_latency(_method))


def _on_event(event: EngineEvent) -> None:
    if event.type == "step.started" and event.seq is not None:
        KILLER.hit("before-step", event.run_id, event.seq)


async def main() -> None:
    global _LOG_FD
    url, log_path = sys.argv[1], sys.argv[2]
    _LOG_FD = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    start_at = float(os.environ.get("FAULT_START_AT", "0"))
    if start_at:
        await asyncio.sleep(max(0.0, start_at - time.time()))
    store = FaultStore.from_url(url)
    engine = durably.Engine(
        store=store,
        workflows=[fault_wf],
        steps=[fault_step],
        instance_id=os.environ.get("FAULT_INSTANCE") or None,
        lease_ms=int(os.environ.get("FAULT_LEASE_MS", "1500")),
        timer_poll_ms=int(os.environ.get("FAULT_POLL_MS", "100")),
        max_concurrent_runs=int(os.environ.get("FAULT_MAX_CONCURRENT", "1000")),
        drain_timeout_ms=int(os.environ.get("FAULT_DRAIN_MS", "10000")),
    )
    engine.subscribe(_on_event)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        async with engine:
            print(f"READY {PID} {time.time():.3f}", flush=True)
            await stop.wait()
            print(f"DRAINING {time.time():.3f}", flush=True)
    finally:
        await store.close()
    print(f"DRAINED {time.time():.3f}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
