"""One benchmark run of durably: ONE workload (W1–W5 of WORKLOADS.md) on ONE backend.

Each run is its own OS process with fresh durable state (a new SQLite file in a temporary
directory, or a new PostgreSQL schema that is dropped afterwards) and prints exactly one JSON
line with the fields WORKLOADS.md names: ``peer``, ``peer_version``, ``backend``,
``workload``, ``n``, ``ok``, ``timeout``, ``error``, the workload's metrics, ``peak_rss_mb``,
``calib_ms_start``/``calib_ms_end`` and ``loadavg_1m``. The measured phase is bounded by a
540 s timeout inside the runner (``benchmarks/matrix.py`` adds the 600 s hard ``timeout(1)``).
Engine start-up happens before the clock starts (except in W5, where restart is measured).

Workloads (``--n`` defaults in brackets):

* ``w1`` [200]: N workflows ``seq_wf(10)`` submitted back to back; ``steps_per_s``,
  ``wf_per_s``, latency ``p50_ms``/``p99_ms`` (nearest rank), ``submit_s``;
* ``w2`` [1000; the matrix also runs 10000]: one ``fan_wf(N)`` = ``sum(await ctx.all(leaf,
  range(N)))`` with ``leaf(i) -> i + 1``; ``wall_s`` (and ``leaf_steps_done_at_timeout``);
* ``w3`` [500]: N workflows that durably sleep 1 s (``ctx.sleep(1)``) then run one ``inc``
  step; ``overhead_s = wall_s - 1.0``;
* ``w4`` [1000]: one ``seq_wf(N)``; ``us_per_step``;
* ``w5`` [100]: crash recovery. This process is only the orchestrator: it spawns worker A
  (``--w5-worker start``) that starts N ``crash_wf(10)`` runs, SIGKILLs it once at least N/2
  runs have logged step 5 (whose step blocks 2 s), then spawns worker B (``--w5-worker
  recover``, same store, same ``instance_id``) and measures ``recovery_s`` = spawn of B → B's
  ``ALLDONE``. Lost, duplicated and wrong results are read from the O_APPEND side-effect log.

Usage::

    python benchmarks/durably_runner.py --backend sqlite --workload w1
    python benchmarks/durably_runner.py --backend postgres --workload w2 --n 10000 \\
        --pg-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import durably
from durably import WorkflowCtx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common

DEFAULT_PG = bench_common.DEFAULT_PG
DEFAULT_N = bench_common.DEFAULT_N
W5_STEPS = bench_common.W5_STEPS
W5_INSTANCE = "w5-worker"
SELF = os.path.abspath(__file__)
TUNING: dict[str, Any] = {}  # --tuning key=value (Engine options); the matrix uses defaults

# ------------------------------------------------------------------------ workflows

_leaf_calls = 0


@durably.step("bench.inc")
async def inc(x: int) -> int:
    return x + 1


@durably.workflow("bench.seq")
async def seq_wf(ctx: WorkflowCtx, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.step(inc, x)
    return x


@durably.step("bench.leaf")
async def leaf(i: int) -> int:
    global _leaf_calls
    _leaf_calls += 1
    return i + 1


@durably.workflow("bench.fan")
async def fan_wf(ctx: WorkflowCtx, n: int) -> int:
    return sum(await ctx.all(leaf, range(n)))


@durably.workflow("bench.timer")
async def timer_wf(ctx: WorkflowCtx, _: None = None) -> int:
    await ctx.sleep(1)
    return await ctx.step(inc, 0)


_W5_LOG = os.devnull


@durably.step("bench.w5_step")
def w5_step(arg: dict[str, Any]) -> int:
    """Log ``<wf_id> <i>`` with one O_APPEND write (survives SIGKILL), block 2 s in step 5."""
    return bench_common.w5_step_effect(_W5_LOG, arg["wf"], arg["i"], int(arg["x"]))


@durably.workflow("bench.crash")
async def crash_wf(ctx: WorkflowCtx, steps: int) -> int:
    x = 0
    for i in range(1, steps + 1):
        x = await ctx.step(w5_step, {"wf": ctx.run_id, "i": i, "x": x})
    return x


WORKFLOWS = [seq_wf, fan_wf, timer_wf, crash_wf]
STEPS = [inc, leaf, w5_step]

# ------------------------------------------------------------------------ helpers


async def drop_schema(pg_url: str, schema: str) -> None:
    from sqlalchemy import text

    from durably._store.sql.dialect import create_engine

    engine = create_engine(pg_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def fresh_store(backend: str, pg_url: str, directory: str) -> AsyncIterator[str]:
    """A store URL with nothing in it: a new SQLite file, or a new schema (dropped after)."""
    if backend == "sqlite":
        yield f"sqlite:///{os.path.join(directory, 'bench.db')}"
        return
    schema = f"bench_run_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        yield bench_common.with_schema(pg_url, schema)
    finally:
        with contextlib.suppress(Exception):
            await drop_schema(pg_url, schema)


def _statements(engine: durably.Engine) -> int:
    return int(getattr(engine.store, "statement_count", 0))


# ------------------------------------------------------------------------ W1 / W3


async def _many(
    engine: durably.Engine,
    workflow: Any,
    arg: Any,
    n: int,
    prefix: str,
    expected: int,
    timeout: float,
    report: dict[str, Any],
) -> float:
    """N workflows submitted together (asyncio tasks started at once); fills the W1/W3 fields.

    Returns the wall time (``max(done_i) - t0``)."""

    async def submit(i: int) -> Any:
        return await engine.start(workflow, arg, run_id=f"{prefix}-{i}")

    async def wait(handle: Any) -> Any:
        return await handle.result()

    return await bench_common.run_many(submit, wait, n, expected, timeout, report)


async def w1(engine: durably.Engine, n: int, timeout: float, report: dict[str, Any]) -> None:
    before = _statements(engine)
    wall = await _many(engine, seq_wf, 10, n, "w1", 10, timeout, report)
    report.update(
        wall_s=round(wall, 4),
        wf_per_s=round(n / wall, 1),
        steps_per_s=round(n * 10 / wall, 1),
        statements_per_step=round((_statements(engine) - before) / (n * 10), 3),
    )


async def w3(engine: durably.Engine, n: int, timeout: float, report: dict[str, Any]) -> None:
    wall = await _many(engine, timer_wf, None, n, "w3", 1, timeout, report)
    report.update(wall_s=round(wall, 4), overhead_s=round(wall - 1.0, 4))


# ------------------------------------------------------------------------ W2 / W4


async def _one(
    engine: durably.Engine,
    workflow: Any,
    n: int,
    expected: int,
    timeout: float,
    report: dict[str, Any],
) -> float:
    t0 = time.perf_counter()
    try:
        run_id = f"{report['workload']}-0"
        result = await engine.execute(workflow, n, run_id=run_id, timeout=timeout)
        report["ok"] = result == expected
        report["completed"] = 1
    except TimeoutError:
        report["timeout"] = True
        report["completed"] = 0
    return time.perf_counter() - t0


async def w2(engine: durably.Engine, n: int, timeout: float, report: dict[str, Any]) -> None:
    before = _statements(engine)
    wall = await _one(engine, fan_wf, n, n * (n + 1) // 2, timeout, report)
    report.update(
        wall_s=round(wall, 4),
        members_per_s=round(n / wall, 1),
        statements_per_member=round((_statements(engine) - before) / n, 3),
    )
    if report["timeout"]:
        report["leaf_steps_done_at_timeout"] = _leaf_calls


async def w4(engine: durably.Engine, n: int, timeout: float, report: dict[str, Any]) -> None:
    before = _statements(engine)
    wall = await _one(engine, seq_wf, n, n, timeout, report)
    report.update(
        wall_s=round(wall, 4),
        us_per_step=round(wall / n * 1e6, 1),
        steps_per_s=round(n / wall, 1),
        statements_per_step=round((_statements(engine) - before) / n, 3),
    )


MEASURED: dict[str, Callable[[durably.Engine, int, float, dict[str, Any]], Awaitable[None]]] = {
    "w1": w1,
    "w2": w2,
    "w3": w3,
    "w4": w4,
}

# ------------------------------------------------------------------------ W5


async def w5_worker(mode: str, url: str, log: str, n: int, timeout: float) -> None:
    """Worker A (``start``: start N runs, keep driving them until killed) or worker B
    (``recover``: open the same store with the same instance_id, await all N, ALLDONE)."""
    global _W5_LOG
    _W5_LOG = log
    engine = durably.Engine(
        store=url, workflows=[crash_wf], steps=[w5_step], instance_id=W5_INSTANCE, **TUNING
    )
    async with engine:
        ids = bench_common.w5_ids(n)
        if mode == "start":
            for run_id in ids:
                await engine.start(crash_wf, W5_STEPS, run_id=run_id)
            print("STARTED", flush=True)
            await asyncio.sleep(3600)
            return
        print(f"LAUNCHED {time.time()}", flush=True)

        async def result_of(run_id: str) -> Any:
            try:
                return await engine.get_handle(run_id).result(timeout=timeout)
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"

        values = await asyncio.gather(*(result_of(r) for r in ids))
        results = dict(zip(ids, values, strict=True))
    print(bench_common.alldone_line(results), flush=True)


class _CheckpointReader:
    """Reads the completed step checkpoints of the store (orchestrator side, plain SQL)."""

    def __init__(self, url: str) -> None:
        from durably._store.sql.dialect import create_engine

        self._engine = create_engine(url)
        self._conn: Any = None

    async def open(self) -> None:
        from sqlalchemy import text

        self._conn = await self._engine.connect()
        await self._conn.execute(text("SELECT 1"))

    async def committed(self) -> set[tuple[str, int]]:
        from sqlalchemy import text

        rows = await self._conn.execute(
            text(
                "SELECT run_id, input FROM durable_step_checkpoints"
                " WHERE status = 'completed' AND name = :name"
            ),
            {"name": w5_step.name},
        )
        out = set()
        for run_id, raw in rows:
            arg = json.loads(raw) if isinstance(raw, str) else raw
            if isinstance(arg, list):  # positional arguments
                arg = arg[0]
            out.add((str(run_id), int(arg["i"])))
        await self._conn.rollback()
        return out

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
        await self._engine.dispose()


async def _read_line(stream: asyncio.StreamReader, prefix: str, deadline: float) -> str | None:
    loop = asyncio.get_running_loop()
    while True:
        left = deadline - loop.time()
        if left <= 0:
            return None
        try:
            line = await asyncio.wait_for(stream.readline(), left)
        except TimeoutError:
            return None
        if not line:
            return None
        text = line.decode().strip()
        if text.startswith(prefix):
            return text


async def w5(url: str, directory: str, n: int, timeout: float, report: dict[str, Any]) -> None:
    log = os.path.join(directory, "side-effects.log")
    bench_common.create_log(log)
    loop = asyncio.get_running_loop()

    async def spawn(mode: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            SELF,
            "--w5-worker",
            mode,
            "--url",
            url,
            "--log",
            log,
            "--n",
            str(n),
            "--timeout",
            str(timeout),
            *(f"--tuning={k}={v}" for k, v in TUNING.items()),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )

    # the committed checkpoints are read right after the kill, before B starts (a warm
    # connection, ~ms): a logged step without one was in flight at the kill
    reader = _CheckpointReader(url)
    await reader.open()
    # 1-2. wait (30 s cap) until at least N/2 distinct runs logged the slow step, then kill
    # (and A has printed STARTED: all N starts acknowledged, so every run exists durably)
    a = await spawn("start")
    cap = loop.time() + bench_common.W5_KILL_CAP_S
    assert a.stdout is not None
    started = asyncio.ensure_future(_read_line(a.stdout, "STARTED", cap))
    reached = False
    try:
        while loop.time() < cap and a.returncode is None:
            if not started.done():
                await asyncio.sleep(0.005)
                continue
            if bench_common.kill_condition_reached(log, n):
                reached = True
                break
            await asyncio.sleep(0.01)
    finally:
        with contextlib.suppress(ProcessLookupError):
            a.send_signal(signal.SIGKILL)
        await a.wait()
        started.cancel()
    kill_offset = len(bench_common.read_log(log))
    t_read = loop.time()
    try:
        committed = await reader.committed()
    finally:
        await reader.close()
    report["checkpoint_read_ms"] = round((loop.time() - t_read) * 1000, 1)
    if not reached:
        report["error"] = bench_common.W5_NOT_REACHED

    # 3. B: same code, same store, same instance identity
    t_spawn = loop.time()
    b = await spawn("recover")
    assert b.stdout is not None
    deadline = t_spawn + timeout
    launched = await _read_line(b.stdout, "LAUNCHED", deadline)
    if launched is not None:
        report["restart_to_launched_s"] = round(loop.time() - t_spawn, 4)
    done = await _read_line(b.stdout, "ALLDONE", deadline) if launched is not None else None
    recovery = loop.time() - t_spawn
    if done is None:
        report["timeout"] = loop.time() >= deadline
        with contextlib.suppress(ProcessLookupError):
            b.kill()
    await b.wait()
    bench_common.fill_w5_report(
        report, log, kill_offset, done, recovery, n, committed=committed, rerun_detail=True
    )


# ------------------------------------------------------------------------ one run


async def run(backend: str, workload: str, n: int, pg_url: str, timeout: float) -> dict[str, Any]:
    report = bench_common.new_report("durably", durably.__version__, backend, workload, n)
    if TUNING:
        report["tuning"] = dict(TUNING)
    try:
        with tempfile.TemporaryDirectory(prefix="durably-bench-") as directory:
            async with fresh_store(backend, pg_url, directory) as url:
                if workload == "w5":
                    await w5(url, directory, n, timeout, report)
                else:
                    engine = durably.Engine(store=url, workflows=WORKFLOWS, steps=STEPS, **TUNING)
                    async with engine:
                        await MEASURED[workload](engine, n, timeout, report)
    except Exception as exc:  # reported, not raised: the matrix goes on
        bench_common.record_error(report, exc)
    return bench_common.finish_report(report)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--workload", choices=sorted(DEFAULT_N), default="w1")
    parser.add_argument("--n", type=int, default=None, help="size (default: per workload)")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="PostgreSQL server (fresh schema)")
    parser.add_argument("--timeout", type=float, default=540.0, help="measured-phase timeout, s")
    parser.add_argument(
        "--tuning",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an Engine option for experiments (e.g. step_threads=128); not used by the matrix",
    )
    parser.add_argument("--w5-worker", choices=["start", "recover"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = args.n if args.n is not None else DEFAULT_N[args.workload]
    for item in args.tuning:
        key, _, value = item.partition("=")
        TUNING[key] = json.loads(value)
    if args.w5_worker:
        asyncio.run(w5_worker(args.w5_worker, args.url, args.log, n, args.timeout))
        return 0
    report = asyncio.run(run(args.backend, args.workload, n, args.pg_url, args.timeout))
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
