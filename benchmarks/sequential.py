"""Sequential-step throughput on the embedded default (issue #2; WORKLOADS.md W1 and W4).

Prints one JSON object per workload:

* ``w4_1000_steps``: one workflow of 1,000 sequential no-op ``inc`` steps;
* ``w1_200x10``: 200 workflows of 10 steps each, all submitted back to back.

Each reports wall time, steps per second, p50/p99 workflow latency (W1), p50/p99 step
latency (time between consecutive step completions of a run) and the number of
store statements per step (``statement_count`` of the store divided by the steps; it counts
the runs' start and finish too). Every workload runs in a fresh SQLite file.

Usage::

    python benchmarks/sequential.py                 # SQLite in a temp dir
    python benchmarks/sequential.py --store memory  # the in-memory reference store
    python benchmarks/sequential.py --reps 3        # median of 3 repetitions
    python benchmarks/sequential.py --store postgres --pg-url postgresql://postgres@127.0.0.1/test
                                                    # PostgreSQL: a fresh schema per run
    python benchmarks/sequential.py --otel          # the cost of tracing (needs durably[otel])

With ``--otel`` it prints one object instead: the 1,000-step workload run ``--reps`` times
(at least 5) with and without `durably.contrib.opentelemetry.TracingInterceptor`, the two
interleaved in one process, and the per-step cost of each (medians) and their difference.
The spans go through the SDK's ``BatchSpanProcessor`` to an exporter that only counts them,
as a production exporter would take them off the steps' path.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import durably

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common
from durably_runner import drop_schema, inc, seq_wf  # the same bench.inc / bench.seq as W1/W4

_PG_SCHEMAS: list[tuple[str, str]] = []


def _store_url(kind: str, directory: str, name: str, pg_url: str = "") -> str:
    if kind == "memory":
        return "memory"
    if kind == "postgres":
        schema = f"bench_{name.replace('-', '_')}_{os.getpid()}"
        _PG_SCHEMAS.append((pg_url, schema))
        return bench_common.with_schema(pg_url, schema)
    path = os.path.join(directory, f"{name}.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    return f"sqlite:///{path}"


async def _step_latencies(engine: durably.Engine, run_ids: list[str]) -> dict[str, float]:
    """Per-step latency: the time between consecutive step completions of a run, read from
    its checkpoints after the measurement (so it costs the measured phase nothing)."""
    gaps: list[float] = []
    for run_id in run_ids:
        times = [cp.finished_at.timestamp() for cp in await engine.list_checkpoints(run_id)]
        gaps += [(b - a) * 1000 for a, b in itertools.pairwise(times)]
    return bench_common.latency_fields(gaps, prefix="step_", digits=3, rank=round)


async def one_long(
    url: str, steps: int, interceptors: list[durably.Interceptor] | None = None
) -> dict[str, Any]:
    async with durably.Engine(
        store=url, workflows=[seq_wf], steps=[inc], interceptors=interceptors
    ) as engine:
        before = engine.store.statement_count  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        result = await engine.execute(seq_wf, steps, run_id="w4-0", timeout=540)
        wall = time.perf_counter() - t0
        statements = engine.store.statement_count - before  # type: ignore[attr-defined]
        step_latency = await _step_latencies(engine, ["w4-0"])
    return {
        "workload": f"w4_{steps}_steps",
        "ok": result == steps,
        "wall_s": round(wall, 4),
        "steps_per_s": round(steps / wall, 1),
        "us_per_step": round(wall / steps * 1e6, 1),
        "statements": statements,
        "statements_per_step": round(statements / steps, 3),
        **step_latency,
    }


async def many_short(url: str, workflows: int, steps: int) -> dict[str, Any]:
    async with durably.Engine(store=url, workflows=[seq_wf], steps=[inc]) as engine:
        before = engine.store.statement_count  # type: ignore[attr-defined]
        latencies: list[float] = []

        async def one(i: int) -> int:
            submitted = time.perf_counter()
            handle = await engine.start(seq_wf, steps, run_id=f"w1-{i}")
            value = await handle.result(timeout=540)
            latencies.append((time.perf_counter() - submitted) * 1000)
            return value

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(workflows)))
        wall = time.perf_counter() - t0
        statements = engine.store.statement_count - before  # type: ignore[attr-defined]
        sample = [f"w1-{i}" for i in range(0, workflows, max(1, workflows // 50))]
        step_latency = await _step_latencies(engine, sample)
    total = workflows * steps
    return {
        "workload": f"w1_{workflows}x{steps}",
        "ok": all(r == steps for r in results),
        "wall_s": round(wall, 4),
        "wf_per_s": round(workflows / wall, 1),
        "steps_per_s": round(total / wall, 1),
        **bench_common.latency_fields(latencies, rank=round),
        "statements": statements,
        "statements_per_step": round(statements / total, 3),
        **step_latency,
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["sqlite", "memory", "postgres"], default="sqlite")
    parser.add_argument(
        "--pg-url",
        default=bench_common.DEFAULT_PG,
        help="PostgreSQL server for --store postgres (each run gets a fresh schema, dropped after)",
    )
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--long-steps", type=int, default=1000)
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--otel", action="store_true", help="per-step cost with and without OTel tracing"
    )
    args = parser.parse_args()
    if args.otel:
        return await tracing_cost(args)
    ok = True
    with tempfile.TemporaryDirectory(prefix="durably-bench-") as directory:
        for name, make in (
            ("long", lambda url: one_long(url, args.long_steps)),
            ("many", lambda url: many_short(url, args.workflows, args.steps)),
        ):
            runs = []
            for rep in range(args.reps):
                url = _store_url(args.store, directory, f"{name}-{rep}", args.pg_url)
                runs.append(await make(url))
            report = bench_common.median_run(runs)
            report.update(
                {
                    "peer": "durably",
                    "peer_version": durably.__version__,
                    "backend": args.store,
                    "python": sys.version.split()[0],
                    "peak_rss_mb": bench_common.peak_rss_mb(),
                    "loadavg_1m": bench_common.loadavg_1m(),
                    "median_of": args.reps,
                }
            )
            ok = ok and bool(report["ok"])
            print(json.dumps(report), flush=True)
    await _drop_pg_schemas()
    return 0 if ok else 1


async def tracing_cost(args: argparse.Namespace) -> int:
    """The 1,000-step workload with and without tracing, interleaved (module doc)."""
    from collections.abc import Sequence
    from statistics import median

    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from durably.contrib.opentelemetry import TracingInterceptor

    class Counting(SpanExporter):
        spans = 0

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            Counting.spans += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Counting()))
    tracing: list[durably.Interceptor] = [TracingInterceptor(tracer_provider=provider)]
    reps = max(args.reps, 5)
    plain: list[float] = []
    traced: list[float] = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="durably-bench-") as directory:
        for rep in range(reps):
            for label, interceptors, out in (
                ("plain", None, plain),
                ("traced", tracing, traced),
            ):
                url = _store_url(args.store, directory, f"otel-{label}-{rep}", args.pg_url)
                report = await one_long(url, args.long_steps, interceptors)
                ok = ok and bool(report["ok"])
                out.append(report["us_per_step"])
    provider.force_flush()
    provider.shutdown()
    plain_us, traced_us = median(plain), median(traced)
    print(
        json.dumps(
            {
                "workload": f"otel_w4_{args.long_steps}_steps",
                "ok": ok,
                "us_per_step_plain": round(plain_us, 1),
                "us_per_step_traced": round(traced_us, 1),
                "tracing_us_per_step": round(traced_us - plain_us, 1),
                "target_us_per_step": 30,
                "spans_exported": Counting.spans,
                "us_per_step_plain_all": plain,
                "us_per_step_traced_all": traced,
                "peer": "durably",
                "peer_version": durably.__version__,
                "backend": args.store,
                "python": sys.version.split()[0],
                "loadavg_1m": bench_common.loadavg_1m(),
                "median_of": reps,
            }
        ),
        flush=True,
    )
    await _drop_pg_schemas()
    return 0 if ok else 1


async def _drop_pg_schemas() -> None:
    for pg_url, schema in _PG_SCHEMAS:
        await drop_schema(pg_url, schema)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
