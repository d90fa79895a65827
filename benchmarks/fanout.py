"""Fan-out / fan-in at scale (issue #4; WORKLOADS.md W2).

Two fan kinds, each one workflow that fans out N members and sums their outputs:

* ``step``: ``await ctx.all(leaf, range(N))`` — N ``leaf(i) -> i + 1`` steps (W2);
* ``child``: ``await ctx.all(leaf_wf, range(N))`` — N child workflows, each one
  ``leaf`` step, so a member is a run of its own (create, lease, checkpoint, settle).

Both return N(N+1)/2. Every case runs in its own subprocess, so ``peak_rss_mb``
(``getrusage(RUSAGE_SELF).ru_maxrss`` at the end) is that case's peak, and in a fresh
SQLite file or a fresh PostgreSQL schema. Each case prints one JSON line: ``wall_s`` from
just before ``start`` to the result, ``statements`` (the store's statement counter over
the measured phase), ``statements_per_member`` and ``peak_rss_mb``. After all cases, one
summary line per (kind, store) gives ``ratio_40k_4k = wall_s(40k) / wall_s(4k)`` (the
linear-growth criterion is <= 12; 10 means exactly linear).

Usage::

    python benchmarks/fanout.py                                 # both kinds, SQLite + PostgreSQL
    python benchmarks/fanout.py --stores sqlite --sizes 1000 4000
    python benchmarks/fanout.py --kinds step --stores memory
    python benchmarks/fanout.py --reps 3                        # medians of 3 (as in the docs)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import durably
from durably import WorkflowCtx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common
from durably_runner import drop_schema

DEFAULT_PG = bench_common.DEFAULT_PG


# defined after importing durably_runner, whose bench.leaf also counts its calls: this one does
# not, and it is the one registered (and passed to the Engine) in this process
@durably.step("bench.leaf")
async def leaf(i: int) -> int:
    return i + 1


@durably.workflow("bench.leaf_wf")
async def leaf_wf(ctx: WorkflowCtx, i: int) -> int:
    return await ctx.step(leaf, i)


@durably.workflow("bench.step_fan")
async def step_fan(ctx: WorkflowCtx, n: int) -> int:
    return sum(await ctx.all(leaf, range(n)))


@durably.workflow("bench.child_fan")
async def child_fan(ctx: WorkflowCtx, n: int) -> int:
    return sum(await ctx.all(leaf_wf, range(n)))


async def one_case(kind: str, store: str, n: int, pg_url: str, timeout: float) -> dict[str, Any]:
    """One measured fan in this process (called in a fresh subprocess by `main`)."""
    workflow = step_fan if kind == "step" else child_fan
    schema = ""
    with tempfile.TemporaryDirectory(prefix="durably-fan-") as directory:
        if store == "memory":
            url = "memory"
        elif store == "sqlite":
            url = f"sqlite:///{os.path.join(directory, 'fan.db')}"
        else:
            schema = f"bench_fan_{os.getpid()}"
            url = bench_common.with_schema(pg_url, schema)
        calib_start = bench_common.calib_ms()
        report: dict[str, Any] = {
            "peer": "durably",
            "peer_version": durably.__version__,
            "backend": store,
            "workload": f"fan_{kind}",
            "kind": kind,
            "n": n,
            "ok": False,
            "timeout": False,
            "error": None,
        }
        try:
            async with durably.Engine(
                store=url, workflows=[step_fan, child_fan, leaf_wf], steps=[leaf]
            ) as engine:
                before = engine.store.statement_count  # type: ignore[attr-defined]
                t0 = time.perf_counter()
                try:
                    result = await engine.execute(workflow, n, run_id="fan", timeout=timeout)
                    report["ok"] = result == n * (n + 1) // 2
                except TimeoutError:
                    report["timeout"] = True
                wall = time.perf_counter() - t0
                statements = engine.store.statement_count - before  # type: ignore[attr-defined]
        except Exception as exc:  # reported, not raised: the matrix goes on
            report["error"] = f"{type(exc).__name__}: {exc}"
            wall, statements = float("nan"), 0
        finally:
            if schema:
                await drop_schema(pg_url, schema)
    report.update(
        {
            "wall_s": round(wall, 3),
            "members_per_s": round(n / wall, 1) if wall == wall and wall > 0 else None,
            "statements": statements,
            "statements_per_member": round(statements / n, 3),
            "peak_rss_mb": bench_common.peak_rss_mb(),
            "calib_ms_start": calib_start,
            "calib_ms_end": bench_common.calib_ms(),
            "loadavg_1m": bench_common.loadavg_1m(),
        }
    )
    return report


def _run_subprocess(kind: str, store: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", kind, store, str(n), "--pg-url", args.pg_url]
    cmd += ["--timeout", str(args.timeout)]
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=args.timeout + 60, check=False
        )
    except subprocess.TimeoutExpired:
        return {"backend": store, "kind": kind, "n": n, "ok": False, "timeout": True}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {
            "backend": store,
            "kind": kind,
            "n": n,
            "ok": False,
            "error": (out.stderr.strip().splitlines() or ["no output"])[-1],
        }
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median wall time (failed runs first, so a failure shows)."""
    failed = [r for r in runs if not r.get("ok")]
    if failed:
        return failed[0]
    return bench_common.median_run(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", nargs="+", choices=["step", "child"], default=["step", "child"])
    parser.add_argument(
        "--stores",
        nargs="+",
        choices=["sqlite", "postgres", "memory"],
        default=["sqlite", "postgres"],
    )
    parser.add_argument("--sizes", nargs="+", type=int, default=[1000, 4000, 10000, 40000])
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--timeout", type=float, default=540)
    parser.add_argument("--reps", type=int, default=1, help="median of this many runs per case")
    parser.add_argument("--one", nargs=3, metavar=("KIND", "STORE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, store, n = args.one
        print(json.dumps(asyncio.run(one_case(kind, store, int(n), args.pg_url, args.timeout))))
        return 0
    ok = True
    for store in args.stores:
        for kind in args.kinds:
            walls: dict[int, float] = {}
            stmts: dict[int, float] = {}
            for n in args.sizes:
                runs = [_run_subprocess(kind, store, n, args) for _ in range(args.reps)]
                report = _median(runs)
                print(json.dumps(report), flush=True)
                ok = ok and bool(report.get("ok"))
                if report.get("ok"):
                    walls[n] = report["wall_s"]
                    stmts[n] = report["statements_per_member"]
            summary: dict[str, Any] = {"summary": f"fan_{kind}", "backend": store}
            summary["wall_s"] = {str(n): w for n, w in walls.items()}
            summary["statements_per_member"] = {str(n): s for n, s in stmts.items()}
            if 4000 in walls and 40000 in walls:
                summary["ratio_40k_4k"] = round(walls[40000] / walls[4000], 2)
            print(json.dumps(summary), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
