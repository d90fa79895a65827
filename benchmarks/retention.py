"""Retention throughput: how fast `prune_terminal_runs` empties a store of finished runs.

Seeds N finished (`completed`, 60 days old) runs, each with one checkpoint, one tag row and one
search-attribute row, plus a few live runs that must survive; then prunes them with
`RetentionPolicy(["completed"], max_age="30d")` in batches of `--batch` (the engine's default,
1000) until a batch comes back short. Prints one JSON line: ``runs_deleted``,
``runs_per_s``, ``batches``, ``longest_batch_ms`` (the longest single batch: one transaction
of one SELECT and one DELETE per table, so an upper bound of the longest single statement),
``median_batch_ms``, ``seed_s`` and the common fields of ``bench_common``. Usage::

    python benchmarks/retention.py [--runs 100000] [--batch 1000] [--store postgresql://…]

Without ``--store`` it uses a fresh SQLite file in a temporary directory; a PostgreSQL URL gets
a fresh schema, dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

import durably
from durably import RetentionPolicy, StepCheckpoint, WorkflowRun
from durably._core.models import ms_from_utc
from durably._store.sql.store import SqlStateStore

SEED_CHUNK = 1000


def _run(i: int, when: datetime, status: str = "completed") -> WorkflowRun:
    return WorkflowRun(
        id=f"run-{i:08d}",
        workflow="report",
        workflow_version="1",
        status=status,  # type: ignore[arg-type]
        input={"n": i},
        output={"ok": True},
        tags=["bench"],
        search_attributes={"customer": f"c{i % 100}"},
        created_at=when,
        updated_at=when,
    )


def _cp(run_id: str, when: datetime) -> StepCheckpoint:
    return StepCheckpoint(
        run_id=run_id,
        seq=0,
        name="render",
        kind="local",
        step_id=f"{run_id}:0",
        status="completed",
        output={"pages": 3},
        attempts=1,
        started_at=when,
        finished_at=when,
    )


async def seed(store: SqlStateStore, n: int, when: datetime) -> None:
    for start in range(0, n, SEED_CHUNK):
        runs = [_run(i, when) for i in range(start, min(start + SEED_CHUNK, n))]
        await store.create_runs(runs)
        await asyncio.gather(*(store.save_checkpoint(_cp(r.id, when)) for r in runs))
    live = [_run(n + i, datetime.now(UTC), status="suspended") for i in range(3)]
    await store.create_runs(live)


async def bench(url: str, n: int, batch: int, report: dict[str, Any]) -> None:
    store = SqlStateStore.from_url(url)
    try:
        await store.ensure_schema()
        long_ago = datetime.now(UTC) - timedelta(days=60)
        t0 = time.perf_counter()
        await seed(store, n, long_ago)
        report["seed_s"] = round(time.perf_counter() - t0, 2)
        policy = RetentionPolicy(["completed"], max_age="30d")
        now = ms_from_utc(datetime.now(UTC))
        timings: list[float] = []
        deleted = 0
        t0 = time.perf_counter()
        while True:
            b0 = time.perf_counter()
            gone = await store.prune_terminal_runs(policy, now, batch)
            timings.append((time.perf_counter() - b0) * 1000)
            deleted += len(gone)
            if len(gone) < batch:
                break
        wall = time.perf_counter() - t0
        left = await store.count_runs(durably.RunQuery())
        report.update(
            runs_deleted=deleted,
            runs_left=left,
            wall_s=round(wall, 3),
            runs_per_s=round(deleted / wall, 1) if wall else None,
            batches=len(timings),
            longest_batch_ms=round(max(timings), 2),
            median_batch_ms=round(statistics.median(timings), 2),
            ok=deleted == n and left == 3,
        )
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--store", default=None, help="a postgresql:// URL (default: SQLite)")
    args = parser.parse_args()
    backend = "postgresql" if args.store else "sqlite"
    report = bench_common.new_report("durably", "dev", backend, "retention", args.runs)
    report["batch"] = args.batch
    with tempfile.TemporaryDirectory() as tmp:
        if args.store:
            schema = f"bench_ret_{uuid.uuid4().hex[:8]}"
            url = bench_common.with_schema(args.store, schema)
        else:
            url, schema = f"sqlite:///{Path(tmp) / 'retention.db'}", None
        try:
            await bench(url, args.runs, args.batch, report)
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
