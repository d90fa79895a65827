"""Throughput with 1, 2 and 4 worker processes sharing one database (issue #3).

An API process (an Engine with `drive=False`) submits W workflows of S no-op steps and waits
for their results; N worker processes (`drive=True`) share the backlog through the store
(`claim_pending_runs`, `FOR UPDATE SKIP LOCKED` on PostgreSQL) and the wake bus (LISTEN/NOTIFY
on PostgreSQL). Every worker count gets a fresh database. Prints one JSON line per count:
wall time, steps/s, the speed-up over one worker, statements per step summed over every
process, and p50/p99 step latency (the time between consecutive step completions of a run,
read from the checkpoints).

Usage::

    python benchmarks/workers.py --pg-url postgresql://postgres@127.0.0.1:5432/postgres
    python benchmarks/workers.py --sqlite            # one SQLite file shared by processes
    python benchmarks/workers.py --workers 1 2 4 --workflows 200 --steps 10
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import durably
from durably import WorkflowCtx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common

HERE = Path(__file__).resolve().parent


@durably.step("bench.w.inc")
async def inc(x: int) -> int:
    return x + 1


@durably.workflow("bench.w.seq")
async def seq_wf(ctx: WorkflowCtx, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.step(inc, x)
    return x


# ------------------------------------------------------------------------ worker process


async def _worker_main(url: str, instance_id: str) -> None:
    engine = durably.Engine(store=url, workflows=[seq_wf], steps=[inc], instance_id=instance_id)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with engine:
        print("READY", flush=True)
        await stop.wait()
        statements = getattr(engine.store, "statement_count", 0)
        completed = engine.metrics().runs["completed"]
    print(json.dumps({"statements": statements, "completed": completed}), flush=True)


# ------------------------------------------------------------------------ databases


def _pg_admin_url(url: str) -> tuple[str, str]:
    base, _, _db = url.rpartition("/")
    return base, base + "/postgres"


async def _fresh_pg(url: str) -> str:
    import asyncpg

    base, admin = _pg_admin_url(url)
    name = f"durably_bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(admin.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return f"{base}/{name}"


async def _drop_pg(url: str) -> None:
    import asyncpg

    _base, admin = _pg_admin_url(url)
    name = url.rpartition("/")[2]
    conn = await asyncpg.connect(admin.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name
        )
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
    finally:
        await conn.close()


# ------------------------------------------------------------------------ one measurement


async def measure(url: str, workers: int, workflows: int, steps: int) -> dict[str, Any]:
    # Create the schema once, before the workers race to do it.
    async with durably.Engine(store=url, workflows=[seq_wf], drive=False):
        pass
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--worker",
            url,
            f"bench-worker-{i}",
            stdout=asyncio.subprocess.PIPE,
        )
        for i in range(workers)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = (await proc.stdout.readline()).decode().strip()
            if line != "READY":
                raise RuntimeError(f"worker did not start: {line!r}")
        async with durably.Engine(store=url, workflows=[seq_wf], drive=False) as api:
            before = getattr(api.store, "statement_count", 0)
            t0 = time.perf_counter()
            handles = [await api.start(seq_wf, steps, run_id=f"w1-{i}") for i in range(workflows)]
            submit_s = time.perf_counter() - t0
            results = await asyncio.gather(*(h.result(timeout=540) for h in handles))
            wall = time.perf_counter() - t0
            api_statements = getattr(api.store, "statement_count", 0) - before
            latencies: list[float] = []
            for h in handles[:: max(1, workflows // 50)]:
                cps = await api.list_checkpoints(h.run_id)
                times = [cp.finished_at.timestamp() for cp in cps]
                latencies += [(b - a) * 1000 for a, b in itertools.pairwise(times)]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        reports = []
        for proc in procs:
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
            lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
            reports.append(json.loads(lines[-1]) if lines else {})
    total = workflows * steps
    worker_statements = sum(int(r.get("statements", 0)) for r in reports)
    return {
        "workers": workers,
        "ok": all(r == steps for r in results),
        "wall_s": round(wall, 4),
        "submit_s": round(submit_s, 4),
        "steps_per_s": round(total / wall, 1),
        "runs_per_worker": [r.get("completed") for r in reports],
        "statements_per_step": round((worker_statements + api_statements) / total, 3),
        "worker_statements_per_step": round(worker_statements / total, 3),
        "step_latency_p50_ms": round(
            bench_common.percentile(latencies, 50, rank=round, default=0.0), 2
        ),
        "step_latency_p99_ms": round(
            bench_common.percentile(latencies, 99, rank=round, default=0.0), 2
        ),
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", nargs=2, metavar=("URL", "INSTANCE_ID"), help=argparse.SUPPRESS)
    parser.add_argument("--pg-url", default=None, help="a PostgreSQL server URL (any database)")
    parser.add_argument("--sqlite", action="store_true", help="share one SQLite file instead")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    if args.worker:
        await _worker_main(*args.worker)
        return 0
    if not args.pg_url and not args.sqlite:
        args.pg_url = "postgresql://postgres@127.0.0.1:5432/postgres"
    ok = True
    baseline: float | None = None
    for count in args.workers:
        if args.sqlite:
            directory = tempfile.mkdtemp(prefix="durably-workers-")
            url = f"sqlite:///{os.path.join(directory, 'bench.db')}"
            report = await measure(url, count, args.workflows, args.steps)
            backend = "sqlite"
        else:
            url = await _fresh_pg(args.pg_url)
            try:
                report = await measure(url, count, args.workflows, args.steps)
            finally:
                await _drop_pg(url)
            backend = "postgres"
        baseline = baseline or report["steps_per_s"]
        report.update(
            {
                "workload": f"w1_{args.workflows}x{args.steps}",
                "backend": backend,
                "speedup_vs_first": round(report["steps_per_s"] / baseline, 2),
                "peer": "durably",
                "peer_version": durably.__version__,
                "loadavg_1m": bench_common.loadavg_1m(),
            }
        )
        ok = ok and bool(report["ok"])
        print(json.dumps(report), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
