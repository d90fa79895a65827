"""Runs over time: what `run_activity` (the console's runs chart) costs on a large store.

Seeds N runs (store bulk `create_runs`, in chunks of 1,000) created over the last 30 days,
most of them completed, some failed, a few still running; then asks for the console's four
windows (60 x 1 min, 48 x 30 min, 28 x 6 h, 30 x 1 day) `--reps` times each, and once
filtered by workflow. Prints one JSON line: per window the median and the longest call in
ms and the buckets answered, ``seed_s``, ``ok`` (the 30-day window counts every run) and the
common fields of ``bench_common``. Usage::

    python benchmarks/run_activity.py [--runs 100000] [--reps 5] [--store postgresql://…]

Without ``--store`` it uses a fresh SQLite file in a temporary directory; a PostgreSQL URL gets
a fresh schema, dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common

from durably import RunQuery, WorkflowRun
from durably._core.models import ms_from_utc
from durably._core.run_activity import ActivityWindow
from durably._store.sql.store import SqlStateStore

SEED_CHUNK = 1000
WINDOWS = {
    "1h": (60_000, 60),
    "24h": (1_800_000, 48),
    "7d": (21_600_000, 28),
    "30d": (86_400_000, 30),
}


def _runs(start: int, stop: int, now: datetime, rng: random.Random) -> list[WorkflowRun]:
    out = []
    for i in range(start, stop):
        created = now - timedelta(seconds=rng.uniform(60, 29 * 86_400))
        roll = rng.random()
        status = "running" if roll < 0.01 else "failed" if roll < 0.08 else "completed"
        out.append(
            WorkflowRun(
                id=f"run-{i:08d}",
                workflow="checkout" if i % 4 else "refund",
                workflow_version="1",
                status=status,  # type: ignore[arg-type]
                input={"n": i},
                created_at=created,
                updated_at=created + timedelta(seconds=rng.uniform(1, 600)),
            )
        )
    return out


def _window(name: str, now_ms: int) -> ActivityWindow:
    width, count = WINDOWS[name]
    until = -(-now_ms // width) * width
    return ActivityWindow(since_ms=until - width * count, bucket_ms=width, buckets=count)


async def bench(url: str, n: int, reps: int, report: dict[str, Any]) -> None:
    store = SqlStateStore.from_url(url)
    try:
        await store.ensure_schema()
        now = datetime.now(UTC)
        rng = random.Random(11)
        t0 = time.perf_counter()
        for start in range(0, n, SEED_CHUNK):
            await store.create_runs(_runs(start, min(start + SEED_CHUNK, n), now, rng))
        report["seed_s"] = round(time.perf_counter() - t0, 2)
        now_ms = ms_from_utc(now)
        windows: dict[str, Any] = {}
        for name in (*WINDOWS, "30d_refund"):
            window = _window(name.split("_")[0], now_ms)
            query = RunQuery(workflow="refund") if name.endswith("refund") else RunQuery()
            timings, answer = [], []
            for _ in range(reps):
                c0 = time.perf_counter()
                answer = await store.run_activity(query, window)
                timings.append((time.perf_counter() - c0) * 1000)
            windows[name] = {
                "median_ms": round(statistics.median(timings), 2),
                "max_ms": round(max(timings), 2),
                "buckets": len(answer),
                "started": sum(b.started for b in answer),
            }
            if name == "30d":
                report["ok"] = windows[name]["started"] == n
        report["windows"] = windows
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--store", default=None, help="a postgresql:// URL (default: SQLite)")
    args = parser.parse_args()
    backend = "postgresql" if args.store else "sqlite"
    report = bench_common.new_report("durably", "dev", backend, "run_activity", args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        if args.store:
            schema = f"bench_act_{uuid.uuid4().hex[:8]}"
            url = bench_common.with_schema(args.store, schema)
        else:
            url, schema = f"sqlite:///{Path(tmp) / 'activity.db'}", None
        try:
            await bench(url, args.runs, args.reps, report)
        except Exception as exc:
            bench_common.record_error(report, exc)
        finally:
            if schema is not None:
                await _drop(args.store, schema)
    print(json.dumps(bench_common.finish_report(report)))


async def _drop(pg_url: str, schema: str) -> None:
    import asyncpg

    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
