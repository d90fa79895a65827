"""Flow-control queues: the rate limit across a fleet, admission cost per step, priority.

Prints one JSON object per measurement (each with the load average: the machine is shared):

* ``rate_limit_fleet``: ``--engines`` engine processes (default 3) on one PostgreSQL store, with
  the slots counted in the store (``admission="store"``) and, a second time, on Redis
  (``admission=<redis url>``; ``--rate-backends``), each keeping runs going whose steps (no-ops)
  all go through one queue limited to ``--rate`` (200) admissions per second, for ``--duration``
  seconds (30; 5 with ``--quick``). Every step appends ``time.time()`` and its pid to a
  side-effect log (one ``O_APPEND`` write); the log is cut into the queue's own windows (1 s,
  aligned to the epoch) and only the whole windows inside the measured span count:
  ``max_window``, ``mean_rate``, ``windows_over_limit`` and ``mean_over_limit`` (mean / limit).
  A step logs when it starts, a little after its admission, so a step admitted at the very end
  of a window can log in the next one: ``store_started_at`` repeats the count over the steps'
  ``started_at`` as recorded in the store (stamped right after admission), which decides ``ok``.
  ``max_sliding_1s`` (the most steps in any 1-s span, not aligned) is for information only: the
  limit is per aligned window.
* ``admission_overhead``: one workflow of ``--steps`` sequential no-op steps, without
  ``queue=`` and with ``queue=`` (a queue of concurrency 1,000,000, so nothing waits), on the
  in-process backend (memory store, ``admission="local"``), on the PostgreSQL backend
  (``admission="store"``; its baseline is the same PostgreSQL store without ``queue=``) and on
  the Redis backend (memory store, ``admission=<redis url>``; ``--backends``). The
  two variants alternate for ``--reps`` repetitions; the median wall time of each gives
  ``overhead_us_per_step`` = (with - without) / steps.
* ``priority``: one engine, a queue of concurrency 2; two runs fan out ``--low-steps`` steps
  each at priority 0 (10 ms each), and while they wait a third run makes 40 sequential steps
  at priority 10. A step's queue wait is from the moment the workflow asks for it to the
  moment its body starts (both ``time.time()``, one process): p50/p99 for each priority.
  Run on each backend.

Redis: the server of ``--redis-url`` (default: the local one), in a logical database of the
benchmark's own (``/15`` unless the URL names one), flushed before and after each measurement
so no slot or window of an earlier run is counted.

Every PostgreSQL measurement runs in a fresh schema, dropped at the end; every engine
process is stopped (SIGTERM, then SIGKILL) before the script exits.

Usage::

    python benchmarks/flow.py                 # 30 s rate test, 1,000-step overhead x 5 reps
    python benchmarks/flow.py --quick         # 5 s rate test, 300 steps x 3 reps
    python benchmarks/flow.py --only rate --duration 60 --pg-url postgresql://postgres@127.0.0.1/test
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import durably
from durably import Queue, WorkflowCtx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common
from durably_runner import drop_schema

SELF = os.path.abspath(__file__)
HUGE = 1_000_000

# ------------------------------------------------------------------------ the workloads

_LOG_FD = -1  # the side-effect log of an engine process, opened O_APPEND once


@durably.step("bench.flow.tick")
async def tick(i: int) -> int:
    os.write(_LOG_FD, f"{time.time():.6f} {os.getpid()}\n".encode())
    return i


@durably.workflow("bench.flow.burst")
async def burst(ctx: WorkflowCtx, n: int) -> int:
    # A fan of n steps at once, so every engine always has steps asking the queue.
    return len(await asyncio.gather(*(ctx.step(tick, i, queue="rate") for i in range(n))))


@durably.step("bench.flow.noop")
async def noop(i: int) -> int:
    return i + 1


@durably.workflow("bench.flow.plain")
async def plain(ctx: WorkflowCtx, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.step(noop, x)
    return x


@durably.workflow("bench.flow.queued")
async def queued(ctx: WorkflowCtx, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.step(noop, x, queue="wide")
    return x


# The priority test runs in this process: the workflow notes when it asks for a step (the
# first time only, should the workflow ever be replayed), the step when its body starts.
_ASKED: dict[str, float] = {}
_STARTED: dict[str, float] = {}


@durably.step("bench.flow.work")
async def work(label: str) -> str:
    _STARTED.setdefault(label, time.time())
    await asyncio.sleep(0.01)
    return label


@durably.workflow("bench.flow.low")
async def low(ctx: WorkflowCtx, n: int) -> int:
    labels = [f"low {ctx.run_id} {i}" for i in range(n)]
    for label in labels:
        _ASKED.setdefault(label, time.time())
    done = await asyncio.gather(*(ctx.step(work, lb, queue="pair") for lb in labels))
    return len(done)


@durably.workflow("bench.flow.high")
async def high(ctx: WorkflowCtx, n: int) -> int:
    for i in range(n):
        label = f"high {ctx.run_id} {i}"
        _ASKED.setdefault(label, time.time())
        await ctx.step(work, label, queue="pair", priority=10)
    return n


# ------------------------------------------------------------------------ PostgreSQL schemas

_SCHEMAS: list[str] = []


async def fresh_pg(pg_url: str, name: str, **options: Any) -> str:
    """A URL on a new schema, created and migrated here (before any engine process opens it)."""
    schema = f"bench_flow_{name}_{os.getpid()}"
    _SCHEMAS.append(schema)
    await drop_schema(pg_url, schema)
    url = bench_common.with_schema(pg_url, schema)
    for key, value in options.items():
        url += f"&{key}={value}"
    async with durably.Client(url) as client:
        await client.list_runs()
    return url


# ------------------------------------------------------------------------ 1. the rate limit


async def _engine_main(
    url: str, log_path: str, name: str, rate: int, until: float, admission: str
) -> None:
    """One engine process of the rate test: keeps ``burst`` runs going until ``until``
    (epoch s), then stops starting them; exits on SIGTERM."""
    global _LOG_FD
    _LOG_FD = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    q = Queue("rate", rate=(rate, "1s"))
    async with durably.Engine(
        url,
        workflows=[burst],
        steps=[tick],
        queues=[q],
        admission=admission,  # type: ignore[arg-type]
        instance_id=name,
        drain_timeout_ms=1000,
    ) as engine:
        print("READY", flush=True)
        n = 0
        in_flight: set[asyncio.Task[Any]] = set()

        async def one(run_id: str) -> None:
            handle = await engine.start(burst, 50, run_id=run_id)
            await handle.result(timeout=600)

        while time.time() < until and not stop.is_set():
            while len(in_flight) < 4:  # 4 runs x 50 steps asking at once, per engine
                task = asyncio.ensure_future(one(f"{name}-{n}"))
                n += 1
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            await asyncio.sleep(0.05)
        print(f"STARTED {n}", flush=True)
        await stop.wait()
        for task in in_flight:
            task.cancel()


def _spawn(cmd: list[str]) -> subprocess.Popen[str]:
    # Started once, before the measured span: a blocking spawn costs the loop nothing here.
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _windows(stamps: list[float], t0: float, t1: float, rate: int) -> dict[str, Any]:
    """The log cut into aligned 1-s windows; only whole windows in [t0, t1) count."""
    first, last = math.ceil(t0), math.floor(t1)  # the whole windows: [first, last)
    counts = collections.Counter(int(t) for t in stamps)
    per_window = [counts[w] for w in range(first, last)]
    ordered = sorted(t for t in stamps if first <= t < last)
    sliding = 0
    for i, t in enumerate(ordered):
        sliding = max(sliding, bisect.bisect_left(ordered, t + 1.0) - i)
    mean = statistics.fmean(per_window) if per_window else 0.0
    return {
        "windows": len(per_window),
        "max_window": max(per_window, default=0),
        "min_window": min(per_window, default=0),
        "mean_rate": round(mean, 1),
        "windows_over_limit": sum(1 for c in per_window if c > rate),
        "any_window_over_limit": any(c > rate for c in per_window),
        "mean_over_limit": round(mean / rate, 3),
        "max_sliding_1s": sliding,
        "per_window": per_window,
    }


async def _flush_redis(redis_url: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()


async def _backend(args: argparse.Namespace, backend: str, name: str) -> tuple[str, str]:
    """The store URL and `admission=` of a measurement on `backend`."""
    if backend == "postgres":
        return await fresh_pg(args.pg_url, name), "store"
    if backend == "redis":
        await _flush_redis(args.redis_url)
        return "memory", args.redis_url
    return "memory", "local"


async def rate_test(args: argparse.Namespace, directory: str, backend: str) -> dict[str, Any]:
    report = _head("rate_limit_fleet", backend)
    report.update(engines=args.engines, limit_per_s=args.rate, duration_s=args.duration)
    url = await fresh_pg(args.pg_url, f"rate_{backend}", pool_size=4, max_overflow=4)
    admission = "store"
    if backend == "redis":
        await _flush_redis(args.redis_url)
        admission = args.redis_url
    report["admission"] = "store" if backend == "postgres" else "redis"
    log_path = os.path.join(directory, "rate.log")
    bench_common.create_log(log_path)
    warmup = 3.0
    # Engines start, then a warm-up; the measured span begins on a window's edge.
    t0 = float(math.ceil(time.time() + warmup + 2.0))
    t1 = t0 + args.duration
    procs: list[subprocess.Popen[str]] = []
    try:
        for k in range(args.engines):
            cmd = [sys.executable, SELF, "--engine", url, log_path, f"e{k}", str(args.rate)]
            cmd += [str(t1 + 0.5), admission]
            procs.append(_spawn(cmd))
        for proc in procs:
            if bench_common.read_line(proc, "READY", time.monotonic() + 60) is None:
                raise RuntimeError("an engine process did not start within 60 s")
        await asyncio.sleep(max(0.0, t1 + 1.0 - time.time()))
        started = [bench_common.read_line(p, "STARTED", time.monotonic() + 15) for p in procs]
        counts = [int(line.split()[1]) if line else 0 for line in started]
        report["runs_started"] = sum(counts)
    finally:
        _stop(procs)
    # The admission times themselves: a step's `started_at` is stamped right after its
    # admission (the engine's clock, in ms), so these windows carry no logging lag.
    admitted: list[float] = []
    async with durably.Client(url) as client:
        for k, count in enumerate(counts):
            for n in range(count):
                for cp in await client.list_checkpoints(f"e{k}-{n}"):
                    if cp.name == tick.name:
                        admitted.append(cp.started_at.timestamp())
    stored = _windows(admitted, t0, t1, args.rate)
    report["store_started_at"] = {
        key: stored[key]
        for key in ("max_window", "mean_rate", "windows_over_limit", "max_sliding_1s")
    }
    report["store_started_at"]["per_window"] = stored["per_window"]
    lines = [line.split() for line in bench_common.read_log(log_path).decode().splitlines()]
    stamps = [float(t) for t, _ in lines]
    report.update(_windows(stamps, t0, t1, args.rate))
    # Every engine must have had its share, or this would measure one process, not a fleet.
    report["admitted_per_engine"] = sorted(
        collections.Counter(pid for t, pid in lines if t0 <= float(t) < t1).values()
    )
    report["ok"] = report["windows"] > 0 and not stored["any_window_over_limit"]
    return report


# ------------------------------------------------------------------------ 2. admission overhead


async def _timed(url: str, admission: str, wf: Any, steps: int, run_id: str) -> float:
    async with durably.Engine(
        url,
        workflows=[plain, queued],
        steps=[noop],
        queues=[Queue("wide", concurrency=HUGE)],
        admission=admission,  # type: ignore[arg-type]
    ) as engine:
        await engine.execute(plain, 3, run_id=f"{run_id}-warm", timeout=60)  # pools, caches
        t0 = time.perf_counter()
        result = await engine.execute(wf, steps, run_id=run_id, timeout=540)
        wall = time.perf_counter() - t0
    if result != steps:
        raise RuntimeError(f"{run_id}: {result} != {steps}")
    return wall


async def overhead_test(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    report = _head("admission_overhead", backend)
    url, admission = await _backend(args, backend, "overhead")
    walls: dict[str, list[float]] = {"without": [], "with": []}
    for rep in range(args.reps):
        for variant, wf in (("without", plain), ("with", queued)):
            run_id = f"{variant}-{rep}"
            walls[variant].append(await _timed(url, admission, wf, args.steps, run_id))
    without, with_ = statistics.median(walls["without"]), statistics.median(walls["with"])
    report.update(
        admission=_shown(admission),
        steps=args.steps,
        reps=args.reps,
        us_per_step_without=round(without / args.steps * 1e6, 1),
        us_per_step_with=round(with_ / args.steps * 1e6, 1),
        overhead_us_per_step=round((with_ - without) / args.steps * 1e6, 1),
        wall_s_without=[round(w, 4) for w in walls["without"]],
        wall_s_with=[round(w, 4) for w in walls["with"]],
        ok=True,
    )
    return report


# ------------------------------------------------------------------------ 3. priority


async def priority_test(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    report = _head("priority", backend)
    url, admission = await _backend(args, backend, "priority")
    _ASKED.clear()
    _STARTED.clear()
    high_steps = 40
    async with durably.Engine(
        url,
        workflows=[low, high],
        steps=[work],
        queues=[Queue("pair", concurrency=2)],
        admission=admission,  # type: ignore[arg-type]
    ) as engine:
        t0 = time.perf_counter()
        lows = [await engine.start(low, args.low_steps, run_id=f"low-{k}") for k in range(2)]
        await asyncio.sleep(0.3)  # the low fans are queued and the queue is saturated
        hi = await engine.start(high, high_steps, run_id="high")
        results = [await h.result(timeout=300) for h in [*lows, hi]]
        wall = time.perf_counter() - t0
    waits: dict[str, list[float]] = {"low": [], "high": []}
    for label, asked in _ASKED.items():
        if label in _STARTED:
            waits[label.split()[0]].append((_STARTED[label] - asked) * 1000)
    high_done = max(_STARTED[f"high high {i}"] for i in range(high_steps))
    low_left = sum(1 for lb, t in _STARTED.items() if lb.startswith("low") and t > high_done)
    report.update(
        admission=_shown(admission),
        concurrency=2,
        low_steps=2 * args.low_steps,
        high_steps=high_steps,
        step_ms=10,
        wall_s=round(wall, 3),
        **bench_common.latency_fields(waits["high"], prefix="high_wait_", digits=1),
        **bench_common.latency_fields(waits["low"], prefix="low_wait_", digits=1),
        high_wait_max_ms=round(max(waits["high"]), 1),
        low_steps_started_after_last_high=low_left,
        ok=results == [args.low_steps, args.low_steps, high_steps],
    )
    return report


# ------------------------------------------------------------------------ the JSON lines


def _shown(admission: str) -> str:
    return "redis" if admission.startswith("redis") else admission


def _head(workload: str, backend: str) -> dict[str, Any]:
    return {
        "peer": "durably",
        "peer_version": durably.__version__,
        "workload": workload,
        "backend": backend,
        "ok": False,
        "error": None,
        "python": sys.version.split()[0],
        "loadavg_1m_start": bench_common.loadavg_1m(),
        "calib_ms_start": bench_common.calib_ms(),
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=bench_common.DEFAULT_PG)
    parser.add_argument("--only", choices=["rate", "overhead", "priority"], action="append")
    parser.add_argument("--quick", action="store_true", help="5 s rate test, fewer steps")
    parser.add_argument("--duration", type=float, default=None, help="rate test, s (30)")
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--rate", type=int, default=200, help="admissions per 1-s window")
    parser.add_argument("--steps", type=int, default=None, help="overhead: steps (1000)")
    parser.add_argument("--reps", type=int, default=None, help="overhead: repetitions (5)")
    parser.add_argument("--low-steps", type=int, default=150, help="priority: per low run")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--backends", default="memory,postgres,redis", help="overhead, priority")
    parser.add_argument("--rate-backends", default="postgres,redis")
    args = parser.parse_args()
    args.duration = args.duration or (5.0 if args.quick else 30.0)
    args.steps = args.steps or (300 if args.quick else 1000)
    args.reps = args.reps or (3 if args.quick else 5)
    only = set(args.only or ["rate", "overhead", "priority"])
    jobs: list[tuple[str, Any]] = []
    if "rate" in only:
        jobs.extend(("rate", backend) for backend in args.rate_backends.split(","))
    for backend in args.backends.split(","):
        if "overhead" in only:
            jobs.append(("overhead", backend))
        if "priority" in only:
            jobs.append(("priority", backend))
    ok = True
    with tempfile.TemporaryDirectory(prefix="durably-flow-") as directory:
        try:
            for kind, backend in jobs:
                try:
                    if kind == "rate":
                        report = await rate_test(args, directory, backend)
                    elif kind == "overhead":
                        report = await overhead_test(args, backend)
                    else:
                        report = await priority_test(args, backend)
                except Exception as exc:
                    report = _head(kind, backend or "postgres")
                    bench_common.record_error(report, exc)
                ok = ok and bool(report["ok"])
                print(json.dumps(bench_common.finish_report(report)), flush=True)
        finally:
            for schema in _SCHEMAS:
                with contextlib.suppress(Exception):
                    await drop_schema(args.pg_url, schema)
            if "redis" in args.backends or "redis" in args.rate_backends:
                with contextlib.suppress(Exception):
                    await _flush_redis(args.redis_url)
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--engine":
        url, log, name, rate, until, admission = sys.argv[2:8]
        asyncio.run(_engine_main(url, log, name, int(rate), float(until), admission))
    else:
        raise SystemExit(asyncio.run(main()))
