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
import collections
import contextlib
import json
import math
import os
import resource
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import durably
from durably import WorkflowCtx

DEFAULT_PG = os.environ.get("DURABLY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
DEFAULT_N = {"w1": 200, "w2": 1000, "w3": 500, "w4": 1000, "w5": 100}
W5_STEPS = 10
W5_SLOW_STEP = 5
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
    fd = os.open(_W5_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{arg['wf']} {arg['i']}\n".encode())
    finally:
        os.close(fd)
    if arg["i"] == W5_SLOW_STEP:
        time.sleep(2)  # a blocking sleep inside the step, not a durable timer
    return int(arg["x"]) + 1


@durably.workflow("bench.crash")
async def crash_wf(ctx: WorkflowCtx, steps: int) -> int:
    x = 0
    for i in range(1, steps + 1):
        x = await ctx.step(w5_step, {"wf": ctx.run_id, "i": i, "x": x})
    return x


WORKFLOWS = [seq_wf, fan_wf, timer_wf, crash_wf]
STEPS = [inc, leaf, w5_step]

# ------------------------------------------------------------------------ helpers


def _calib_ms() -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(1_000_000):
        x += i
    return round((time.perf_counter() - t0) * 1000, 1)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))  # nearest rank
    return ordered[rank - 1]


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _with_schema(pg_url: str, schema: str) -> str:
    return f"{pg_url}{'&' if '?' in pg_url else '?'}schema={schema}"


async def _drop_schema(pg_url: str, schema: str) -> None:
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
        yield _with_schema(pg_url, schema)
    finally:
        with contextlib.suppress(Exception):
            await _drop_schema(pg_url, schema)


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
    subs: dict[int, float] = {}
    dones: dict[int, float] = {}
    results: dict[int, int] = {}
    submitted: list[float] = []

    async def one(i: int) -> None:
        subs[i] = time.perf_counter()
        handle = await engine.start(workflow, arg, run_id=f"{prefix}-{i}")
        submitted.append(time.perf_counter())
        results[i] = await handle.result()
        dones[i] = time.perf_counter()

    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    except TimeoutError:
        report["timeout"] = True
    wall = (max(dones.values()) if len(dones) == n else time.perf_counter()) - t0
    latencies = [(dones[i] - subs[i]) * 1000 for i in dones]
    report["completed"] = len(dones)
    report["ok"] = len(results) == n and all(v == expected for v in results.values())
    report["submit_s"] = round(max(submitted) - t0, 4) if submitted else None
    if latencies:
        report["p50_ms"] = round(_pct(latencies, 50), 2)
        report["p99_ms"] = round(_pct(latencies, 99), 2)
    return wall


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
        ids = [f"w5-{i}" for i in range(n)]
        if mode == "start":
            for run_id in ids:
                await engine.start(crash_wf, W5_STEPS, run_id=run_id)
            print("STARTED", flush=True)
            await asyncio.sleep(3600)
            return
        print(f"LAUNCHED {time.time()}", flush=True)

        async def result_of(run_id: str) -> Any:
            try:
                return await engine.handle(run_id).result(timeout=timeout)
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"

        values = await asyncio.gather(*(result_of(r) for r in ids))
        results = dict(zip(ids, values, strict=True))
    print("ALLDONE " + json.dumps({"results": results, "peak_rss_mb": _peak_rss_mb()}), flush=True)


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


def _read_log(path: str) -> bytes:
    """The side-effect log (small: N x 10 short lines, read synchronously)."""
    with open(path, "rb") as f:
        return f.read()


def _log_pairs(data: bytes) -> list[tuple[str, int]]:
    pairs = []
    for line in data.decode().splitlines():
        parts = line.split()
        if len(parts) == 2:
            pairs.append((parts[0], int(parts[1])))
    return pairs


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
    os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
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
    cap = loop.time() + 30
    assert a.stdout is not None
    started = asyncio.ensure_future(_read_line(a.stdout, "STARTED", cap))
    reached = False
    try:
        while loop.time() < cap and a.returncode is None:
            if not started.done():
                await asyncio.sleep(0.005)
                continue
            data = _read_log(log)
            in_slow = {wf for wf, i in _log_pairs(data) if i == W5_SLOW_STEP}
            if len(in_slow) >= n // 2:
                reached = True
                break
            await asyncio.sleep(0.01)
    finally:
        with contextlib.suppress(ProcessLookupError):
            a.send_signal(signal.SIGKILL)
        await a.wait()
        started.cancel()
    kill_offset = len(_read_log(log))
    t_read = loop.time()
    try:
        committed = await reader.committed()
    finally:
        await reader.close()
    report["checkpoint_read_ms"] = round((loop.time() - t_read) * 1000, 1)
    if not reached:
        report["error"] = "the kill condition was not reached within 30 s (killed anyway)"

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
    payload: dict[str, Any] = json.loads(done.removeprefix("ALLDONE ")) if done else {}
    results: dict[str, Any] = payload.get("results", {})

    data = _read_log(log)
    before = _log_pairs(data[:kill_offset])
    counts = collections.Counter(_log_pairs(data))
    last_before: dict[str, int] = {}
    for wf, i in before:
        last_before[wf] = max(i, last_before.get(wf, 0))
    ids = [f"w5-{i}" for i in range(n)]
    dup_by_step: collections.Counter[int] = collections.Counter()
    completed_rerun = 0  # a re-run of a step that was not the last one a run had started
    for (wf, i), c in counts.items():
        if c > 1:
            dup_by_step[i] += 1
            if last_before.get(wf) != i:
                completed_rerun += 1
    missing = [(wf, i) for wf in ids for i in range(1, W5_STEPS + 1) if counts[(wf, i)] == 0]
    never = [wf for wf in ids if not isinstance(results.get(wf), int)]
    wrong = [wf for wf in ids if isinstance(results.get(wf), int) and results[wf] != W5_STEPS]
    in_flight = {pair for pair in set(before) if pair not in committed}
    rerun_committed = sum(1 for pair, c in counts.items() if c > 1 and pair in committed)
    rerun_not_in_flight = sum(1 for pair, c in counts.items() if c > 1 and pair not in in_flight)
    report.update(
        recovery_s=round(recovery, 4),
        completed=sum(1 for wf in ids if results.get(wf) == W5_STEPS),
        dup_pairs=sum(dup_by_step.values()),
        dup_extra_executions=sum(c - 1 for c in counts.values() if c > 1),
        dup_pairs_by_step={str(k): v for k, v in sorted(dup_by_step.items())},
        dup_pairs_not_last_started=completed_rerun,
        missing_pairs=len(missing),
        never_finished=len(never),
        wrong_result=len(wrong),
        wfs_inside_slow_step_at_kill=sum(1 for v in last_before.values() if v == W5_SLOW_STEP),
        wfs_past_slow_step_at_kill=sum(1 for v in last_before.values() if v > W5_SLOW_STEP),
        steps_logged_before_kill=len(before),
        steps_in_flight_at_kill=len(in_flight),
        committed_steps_at_kill=len(committed),
        reran_committed_steps=rerun_committed,
        reran_steps_not_in_flight=rerun_not_in_flight,
        orchestrator_peak_rss_mb=_peak_rss_mb(),
        peak_rss_mb=payload.get("peak_rss_mb"),
    )
    if never and not report["error"]:
        report["error"] = f"{len(never)} runs not done, e.g. {never[0]}: {results.get(never[0])}"
    report["ok"] = not (missing or never or wrong) and done is not None
    report["reruns_within_in_flight"] = rerun_not_in_flight == 0 and report[
        "dup_extra_executions"
    ] <= len(in_flight)


# ------------------------------------------------------------------------ one run


async def run(backend: str, workload: str, n: int, pg_url: str, timeout: float) -> dict[str, Any]:
    report: dict[str, Any] = {
        "peer": "durably",
        "peer_version": durably.__version__,
        "backend": backend,
        "workload": workload,
        "n": n,
        "ok": False,
        "timeout": False,
        "error": None,
        "python": sys.version.split()[0],
        "loadavg_1m_start": round(os.getloadavg()[0], 2),
        "calib_ms_start": _calib_ms(),
    }
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
        report["ok"] = False
        report["error"] = f"{type(exc).__name__}: {exc}"[:500]
    if "peak_rss_mb" not in report or report["peak_rss_mb"] is None:
        report["peak_rss_mb"] = _peak_rss_mb()
    report["calib_ms_end"] = _calib_ms()
    report["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return report


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
