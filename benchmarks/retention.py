"""Retention throughput: how fast `prune_terminal_runs` empties a store of finished runs.

Seeds N finished (`completed`, 60 days old) runs, each with one checkpoint, one tag row and one
search-attribute row, plus control runs that must all survive with their checkpoints: 3 live
(`suspended`) runs, 10 old `failed` runs (a status the policy does not name) and 10 recent
`completed` runs (younger than its age). Then a dry run counts what the policy would delete and
`RetentionPolicy(["completed"], max_age="30d")` prunes in batches of `--batch` (the engine's
default, 1000) until a batch comes back short.

Prints one JSON line: ``runs_deleted``, ``runs_per_s``, ``batches``, ``longest_batch_ms`` (the
longest batch: one transaction of one SELECT and one DELETE per table),
``longest_statement_ms`` and ``longest_statement`` (the longest single SQL statement of the
prune, timed around its driver call, and its first words), ``median_batch_ms``, ``seed_s``,
``dry_run_count``, the checks (``deleted_exactly_the_policy``: the ids deleted are exactly the
seeded old completed runs, each once, and the dry run counted that many;
``controls_untouched``: every control run is still there with its checkpoint;
``side_rows_left``: checkpoint, tag and attribute rows left, only the controls' ones), ``ok``
(every check holds) and the common fields of ``bench_common``. Usage::

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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common

import durably
from durably import RetentionPolicy, StepCheckpoint, WorkflowRun
from durably._core.models import ms_from_utc
from durably._store.sql.runner import StatementRunner
from durably._store.sql.store import SqlStateStore

SEED_CHUNK = 1000
CONTROLS = {"suspended": 3, "failed": 10, "recent": 10}


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


async def _create(store: SqlStateStore, runs: list[WorkflowRun], when: datetime) -> None:
    await store.create_runs(runs)
    await asyncio.gather(*(store.save_checkpoint(_cp(r.id, when)) for r in runs))


async def seed(store: SqlStateStore, n: int, when: datetime) -> list[str]:
    """The N prunable runs, then the controls; returns the controls' ids."""
    for start in range(0, n, SEED_CHUNK):
        await _create(
            store, [_run(i, when) for i in range(start, min(start + SEED_CHUNK, n))], when
        )
    now = datetime.now(UTC)
    i = n
    controls: list[WorkflowRun] = []
    for kind, count in CONTROLS.items():
        for _ in range(count):
            if kind == "recent":
                controls.append(_run(i, now - timedelta(days=1)))
            elif kind == "failed":
                controls.append(_run(i, when, status="failed"))
            else:
                controls.append(_run(i, now, status="suspended"))
            i += 1
    await _create(store, controls, now)
    return [r.id for r in controls]


@contextmanager
def statement_timer() -> Iterator[list[tuple[float, str]]]:
    """Every SQL statement a store runs inside a transaction meanwhile (a prune batch's SELECT
    and DELETEs), timed around the driver call on both backends: (ms, its first words)."""
    timed: list[tuple[float, str]] = []
    originals = {name: getattr(StatementRunner, name) for name in ("fetch", "run")}

    def timing(name: str) -> Any:
        inner = originals[name]

        async def timed_call(self: StatementRunner, s: Any, stmt: Any, params: Any = None) -> Any:
            t0 = time.perf_counter()
            try:
                return await inner(self, s, stmt, params)
            finally:
                words = " ".join(str(stmt).split()[:4])
                timed.append(((time.perf_counter() - t0) * 1000, words))

        return timed_call

    for name in originals:
        setattr(StatementRunner, name, timing(name))
    try:
        yield timed
    finally:
        for name, original in originals.items():
            setattr(StatementRunner, name, original)


async def _count(store: SqlStateStore, table: str) -> int:
    async with store.engine.connect() as conn:
        return int((await conn.execute(sa.text(f"SELECT count(*) FROM {table}"))).scalar_one())


async def bench(url: str, n: int, batch: int, report: dict[str, Any]) -> None:
    store = SqlStateStore.from_url(url)
    try:
        await store.ensure_schema()
        long_ago = datetime.now(UTC) - timedelta(days=60)
        t0 = time.perf_counter()
        controls = await seed(store, n, long_ago)
        report["seed_s"] = round(time.perf_counter() - t0, 2)
        policy = RetentionPolicy(["completed"], max_age="30d")
        now = ms_from_utc(datetime.now(UTC))
        would = await store.prune_terminal_runs(policy, now, n + 1000, dry_run=True)
        timings: list[float] = []
        gone_ids: list[str] = []
        with statement_timer() as statements:
            t0 = time.perf_counter()
            while True:
                b0 = time.perf_counter()
                gone = await store.prune_terminal_runs(policy, now, batch)
                timings.append((time.perf_counter() - b0) * 1000)
                gone_ids.extend(gone)
                if len(gone) < batch:
                    break
            wall = time.perf_counter() - t0
        deleted = len(gone_ids)
        left = await store.count_runs(durably.RunQuery())
        expected = {f"run-{i:08d}" for i in range(n)}
        exact = len(set(gone_ids)) == deleted and set(gone_ids) == expected and len(would) == n
        survivors = [await store.get_run(rid) for rid in controls]
        kept_cps = [len(await store.list_checkpoints(rid)) for rid in controls]
        untouched = all(r is not None for r in survivors) and kept_cps == [1] * len(controls)
        side = {
            table: await _count(store, table)
            for table in ("durable_step_checkpoints", "durable_run_tags", "durable_run_attributes")
        }
        slowest = max(statements, default=(0.0, ""))
        report.update(
            runs_deleted=deleted,
            runs_left=left,
            wall_s=round(wall, 3),
            runs_per_s=round(deleted / wall, 1) if wall else None,
            batches=len(timings),
            longest_batch_ms=round(max(timings), 2),
            median_batch_ms=round(statistics.median(timings), 2),
            statements=len(statements),
            longest_statement_ms=round(slowest[0], 2),
            longest_statement=slowest[1],
            dry_run_count=len(would),
            deleted_exactly_the_policy=exact,
            controls_untouched=untouched,
            side_rows_left=side,
            ok=exact
            and untouched
            and left == len(controls)
            and all(count == len(controls) for count in side.values()),
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
