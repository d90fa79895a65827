"""CPU cost of 1, 2 and 4 worker processes sharing one PostgreSQL database.

Every configuration runs the same workload in a fresh schema: an API process (an ``Engine``
with ``drive=False``) starts ``--runs`` runs of a workflow of ``--steps`` no-op steps and waits
for their results, while W worker processes (each its own driving ``Engine``, like ``durably
worker``) share the backlog through the store. The measured window is from the API's first
``start`` to its last result. Prints ONE JSON document on stdout (progress goes to stderr):

* ``cpu_per_1k_steps_s``: CPU seconds (user + system) per 1,000 steps summed over the workers,
  the API process and the PostgreSQL backends serving their connections, including backends
  that were opened and closed inside the window (``cpu_accounting.py`` says how each is read).
  A backend is ours when one of our processes opened it (each records the server pid of every
  connection it opens, ``get_server_pid()``). The rest of the server (WAL writer,
  checkpointer, other clients' backends) is reported as ``pg_rest_cpu_s`` and not counted:
  this machine's PostgreSQL is shared with other work, whose CPU would otherwise count as ours.
* ``wall_s`` and ``steps_per_s`` (information only: on a 2-core machine more processes cannot
  add throughput).
* ``claims``: how the workers picked runs up. With ``FOR UPDATE SKIP LOCKED`` a worker never
  sees a run another one took: its claim returns fewer rows, or none (``empty``).
  ``conflicts`` counts claims of one named run (``claim_run``/``claim_runs``)
  that another worker had already taken. Counted by wrapping each process's store methods
  (``store_calls_per_1k_steps`` lists every store call), not by the engine.
* ``runs_executed_twice`` / ``steps_executed_twice``: each step appends ``<run> <step> <pid>``
  to a side-effect log (one ``O_APPEND`` write); a run whose steps ran in two processes, or a
  step that ran twice, is counted. Both must be 0.
* ``cpu_ratio_4_vs_1``: CPU per 1,000 steps with 4 workers / with 1; ``target_met`` is
  ``ratio <= 1.3``.
* To see where CPU goes: ``round_trips_per_1k_steps`` (asyncpg calls), ``rows_read_per_1k_steps``
  (rows returned by the store's listing calls), ``pg_connections_opened`` (a connection costs
  a few milliseconds of CPU on each side), ``context_switches_per_1k_steps`` (workers and API),
  ``wakes_received`` (wake-bus messages handled by the workers) and, with ``--py-spy DIR``, a
  ``py-spy`` profile of each worker over the window. ``pg_connection_budget`` warns when the
  pools of the largest configuration can exceed the server's ``max_connections``.

Each configuration keeps the repetition with the median CPU per 1,000 steps; repetitions run
1, 2, 4, 1, 2, 4, … so that a change in the machine's other load hits every count alike.
Exit status 1 when a step ran twice, a run ran in two processes or a run did not complete.

Usage::

    python benchmarks/workers.py                       # --workers 1,2,4 --runs 1000 --steps 20
    python benchmarks/workers.py --workers 1,4 --reps 5 \\
        --pg-url 'postgresql://postgres@127.0.0.1:5432/test?max_overflow=0'
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import functools
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import durably
from durably import WorkflowCtx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common
import cpu_accounting
from durably_runner import drop_schema

SELF = os.path.abspath(__file__)
TARGET_RATIO = 1.3

# ------------------------------------------------------------------------ the workload

_LOG_FD = -1  # the side-effect log, opened O_APPEND once per worker process


@durably.step("bench.workers.effect")
async def effect(arg: dict[str, Any]) -> int:
    # One short write to a local file: microseconds, so doing it on the loop is fine here.
    os.write(_LOG_FD, f"{arg['run']} {arg['i']} {os.getpid()}\n".encode())
    return int(arg["i"]) + 1


@durably.workflow("bench.workers.seq")
async def seq_wf(ctx: WorkflowCtx, steps: int) -> int:
    x = 0
    for i in range(steps):
        x = await ctx.step(effect, {"run": ctx.run_id, "i": i})
    return x


# ------------------------------------------------------------------------ counting store calls


class CallCounter:
    """Counts the calls of every public coroutine method of a store instance, and how the
    pick-up claims went (rows returned, empty claims, claims of a named run refused)."""

    def __init__(self, store: Any) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.rows: collections.Counter[str] = collections.Counter()  # of calls returning lists
        self.claims = {"statements": 0, "rows": 0, "empty": 0, "conflicts": 0}
        for name in dir(type(store)):
            if name.startswith("_") or not asyncio.iscoroutinefunction(getattr(store, name)):
                continue
            setattr(store, name, self._wrap(name, getattr(store, name)))

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            result = await method(*args, **kwargs)
            if isinstance(result, list):
                self.rows[name] += len(result)
            if name == "claim_pending_runs":
                self.claims["statements"] += 1
                self.claims["rows"] += len(result)
                self.claims["empty"] += not result
            elif name == "claim_run":
                self.claims["conflicts"] += not result
            elif name == "claim_runs":
                self.claims["conflicts"] += len(args[0]) - len(result)
            return result

        return counted


# ------------------------------------------------------------------------ child processes


def _track_connections() -> tuple[list[int], collections.Counter[str]]:
    """Record the server pid of every PostgreSQL connection this process opens (the store's
    pool and wake bus connect through SQLAlchemy, which calls ``asyncpg.connect``) and count
    the round trips made on them (``executemany`` rows apart)."""
    import asyncpg  # type: ignore[import-untyped]

    pids: list[int] = []
    trips: collections.Counter[str] = collections.Counter()
    real_connect = asyncpg.connect

    async def connect(*args: Any, **kwargs: Any) -> Any:
        conn = await real_connect(*args, **kwargs)
        pids.append(conn.get_server_pid())
        return conn

    asyncpg.connect = connect
    cls = asyncpg.connection.Connection
    for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
        real = getattr(cls, name)

        def counted(real: Any = real, name: str = name) -> Any:
            async def call(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
                trips[name] += 1
                if name == "executemany" and args:
                    trips["executemany_rows"] += len(args[0])
                return await real(self, query, *args, **kwargs)

            return call

        setattr(cls, name, counted())
    return pids, trips


async def _worker_main(url: str, log_path: str, name: str) -> None:
    global _LOG_FD
    _LOG_FD = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    server_pids, trips = _track_connections()
    engine = durably.Engine(store=url, workflows=[seq_wf], steps=[effect], instance_id=name)
    counter = CallCounter(engine.store)
    wakes: collections.Counter[str] = collections.Counter()
    on_wake = engine.wakes._on_wake

    def counted_wake(kind: str, run_id: str) -> None:
        wakes[kind] += 1
        on_wake(kind, run_id)

    engine.wakes._on_wake = counted_wake  # type: ignore[method-assign]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with engine:
        print("READY", flush=True)
        await stop.wait()
        completed = engine.metrics().runs["completed"]
    report = {
        "name": name,
        "pid": os.getpid(),
        "completed": completed,
        "statements": int(getattr(engine.store, "statement_count", 0)),
        "claims": counter.claims,
        "calls": dict(counter.calls),
        "rows": dict(counter.rows),
        "wakes": dict(wakes),
        "server_pids": server_pids,
        "round_trips": dict(trips),
    }
    print("REPORT " + json.dumps(report), flush=True)


async def _api_main(url: str, runs: int, steps: int) -> None:
    loop = asyncio.get_running_loop()
    server_pids, trips = _track_connections()
    async with durably.Engine(store=url, workflows=[seq_wf], drive=False) as api:
        counter = CallCounter(api.store)
        print("READY", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # the parent's GO
        statements = int(getattr(api.store, "statement_count", 0))
        trips.clear()
        t0 = time.perf_counter()
        handles = await asyncio.gather(
            *(api.start(seq_wf, steps, run_id=f"r{i}") for i in range(runs))
        )
        submit_s = time.perf_counter() - t0
        # One waiter at a time, in start order: concurrent waiters would each poll the store
        # every second (the fallback behind the wake bus), a cost that grows with the wall
        # time rather than with the work, and would blur the comparison of worker counts.
        results: list[Any] = []
        read_errors: list[str] = []
        deadline = time.monotonic() + 540
        for handle in handles:
            while True:
                try:
                    results.append(await handle.result(timeout=deadline - time.monotonic()))
                    break
                except Exception as exc:  # a failed read is retried; a failed run is kept
                    if isinstance(exc, durably.RunFailedError) or time.monotonic() > deadline:
                        results.append(exc)
                        break
                    read_errors.append(f"{type(exc).__name__}: {exc}"[:200])
                    await asyncio.sleep(0.2)
        wall = time.perf_counter() - t0
        report = {
            "wall_s": round(wall, 4),
            "submit_s": round(submit_s, 4),
            "completed": sum(1 for r in results if r == steps),
            "failures": [repr(r)[:200] for r in results if r != steps][:5],
            "result_read_errors": len(read_errors),
            "result_read_error_sample": read_errors[:3],
            "statements": int(getattr(api.store, "statement_count", 0)) - statements,
            "calls": dict(counter.calls),
            "rows": dict(counter.rows),
            "server_pids": server_pids,
            "round_trips": dict(trips),
        }
        print("DONE " + json.dumps(report), flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # the parent's EXIT


# ------------------------------------------------------------------------ one configuration


def _analyse_log(path: str, runs: int, steps: int) -> dict[str, Any]:
    counts: collections.Counter[tuple[str, int]] = collections.Counter()
    pids_of: dict[str, set[int]] = collections.defaultdict(set)
    for line in bench_common.read_log(path).decode().splitlines():
        run, step, pid = line.split()
        counts[(run, int(step))] += 1
        pids_of[run].add(int(pid))
    return {
        "steps_logged": sum(counts.values()),
        "steps_executed_twice": sum(1 for c in counts.values() if c > 1),
        "runs_executed_twice": sum(1 for p in pids_of.values() if len(p) > 1),
        "steps_missing": sum(
            1 for r in range(runs) for s in range(steps) if counts[(f"r{r}", s)] == 0
        ),
    }


class Server:
    """The local PostgreSQL server whose processes' CPU is measured (None parts if remote)."""

    def __init__(self, pg_url: str) -> None:
        self.postmaster = cpu_accounting.find_postmaster(urllib.parse.urlsplit(pg_url).port or 5432)
        self.listener: cpu_accounting.ExitListener | None = None
        self.exit_accounting = "no local server: the server's CPU is not measured"
        if self.postmaster is not None:
            self.listener, self.exit_accounting = cpu_accounting.exit_listener(self.postmaster)

    def meter(self) -> cpu_accounting.ServerCpu | None:
        if self.postmaster is None:
            return None
        return cpu_accounting.ServerCpu(self.postmaster, self.listener)


def _stop(procs: list[subprocess.Popen[str]], api: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """Stop the API process and the workers; the workers' reports."""
    if api.stdin is not None:
        with contextlib.suppress(OSError):
            api.stdin.write("EXIT\n")
            api.stdin.close()
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    reports = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        lines = [ln for ln in out.splitlines() if ln.startswith("REPORT ")]
        reports.append(json.loads(lines[-1].removeprefix("REPORT ")) if lines else {})
    try:
        api.wait(timeout=60)
    except subprocess.TimeoutExpired:
        api.kill()
    return reports


async def connection_budget(pg_url: str, counts: list[int]) -> dict[str, Any]:
    """Whether the largest configuration's pools can exceed the server's connection limit
    (then connections are refused with "too many clients" and turns are retried)."""
    from sqlalchemy import text

    from durably._store.sql import pg
    from durably._store.sql.dialect import create_engine

    query = urllib.parse.parse_qs(urllib.parse.urlsplit(pg_url).query)
    size = int(query.get("pool_size", [pg.DEFAULT_POOL_SIZE])[0])
    overflow = int(query.get("max_overflow", [pg.DEFAULT_MAX_OVERFLOW])[0])
    engine = create_engine(pg_url)
    try:
        async with engine.connect() as conn:
            limit = int((await conn.execute(text("SHOW max_connections"))).scalar_one())
            reserved = (await conn.execute(text("SHOW superuser_reserved_connections"))).scalar()
            in_use = (await conn.execute(text("SELECT count(*) FROM pg_stat_activity"))).scalar()
    finally:
        await engine.dispose()
    processes = max(counts) + 1  # the workers and the API process
    ours = processes * (size + overflow + 1)  # each pool, plus each wake-bus listener
    available = limit - int(reserved or 0) - int(in_use or 0)
    return {
        "max_connections": limit,
        "in_use_at_start": in_use,
        "ours_at_most": ours,
        "may_exceed": ours > available,
    }


def _profilers(directory: str | None, pids: list[int], tag: str) -> list[subprocess.Popen[str]]:
    """``py-spy record`` of each worker over the window (``--py-spy DIR``); its own CPU is
    not counted (and it samples without pausing the worker, ``--nonblocking``)."""
    if directory is None:
        return []
    os.makedirs(directory, exist_ok=True)
    command = ["py-spy", "record", "--nonblocking", "-r", "200", "-f", "raw"]
    return [
        subprocess.Popen(
            [*command, "--pid", str(pid), "-o", os.path.join(directory, f"{tag}-worker{i}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for i, pid in enumerate(pids)
    ]


async def measure(
    url: str, workers: int, runs: int, steps: int, server: Server, profile: str | None = None
) -> dict[str, Any]:
    # This loop only orchestrates (nothing else runs on it), so the blocking waits for the
    # children's lines below cost nothing. Create the tables once, before the workers start
    # (they would all wait on the migration lock).
    async with durably.Engine(store=url, workflows=[seq_wf], drive=False):
        pass
    with tempfile.TemporaryDirectory(prefix="durably-workers-") as log_dir:
        log_path = os.path.join(log_dir, "effects.log")
        bench_common.create_log(log_path)
        spawn = functools.partial(subprocess.Popen, stdout=subprocess.PIPE, text=True)
        procs = [
            spawn([sys.executable, SELF, "--role", "worker", url, log_path, f"bench-w{i}"])
            for i in range(workers)
        ]
        api = spawn(
            [sys.executable, SELF, "--role", "api", url, str(runs), str(steps)],
            stdin=subprocess.PIPE,
        )
        done = None
        try:
            for proc in [*procs, api]:
                if bench_common.read_line(proc, "READY", time.monotonic() + 60) is None:
                    raise RuntimeError(f"a benchmark process did not start (exit {proc.poll()})")
            pids = [p.pid for p in procs] + [api.pid]
            meter = server.meter()
            if meter is not None:
                meter.start()
            spies = _profilers(profile, pids[:-1], f"{workers}w-{uuid.uuid4().hex[:4]}")
            cpu_start = {pid: cpu_accounting.cpu_s(pid) or 0.0 for pid in pids}
            switches_start = [cpu_accounting.context_switches(pid) for pid in pids]
            assert api.stdin is not None
            api.stdin.write("GO\n")
            api.stdin.flush()
            done = bench_common.read_line(api, "DONE ", time.monotonic() + 600)
            cpu = {pid: (cpu_accounting.cpu_s(pid) or 0.0) - cpu_start[pid] for pid in pids}
            switches = [
                [b - a for a, b in zip(start, cpu_accounting.context_switches(pid), strict=True)]
                for pid, start in zip(pids, switches_start, strict=True)
            ]
            if meter is not None:
                meter.stop()
            for spy in spies:
                spy.send_signal(signal.SIGINT)  # py-spy writes its file and exits
            for spy in spies:
                spy.wait(timeout=30)
        finally:
            reports = _stop(procs, api)
        if done is None:
            raise RuntimeError("the API process did not report its results")
        result = json.loads(done.removeprefix("DONE "))
        effects = _analyse_log(log_path, runs, steps)
    ours = set(result["server_pids"]).union(*(r.get("server_pids", []) for r in reports))
    pg = meter.split(ours) if meter is not None else None
    report = _report(workers, runs, steps, result, reports, [cpu[p] for p in pids], pg, effects)
    per_1k = 1000 / (runs * steps)
    report["context_switches_per_1k_steps"] = {
        "voluntary": round(sum(v for v, _ in switches) * per_1k, 1),
        "involuntary": round(sum(i for _, i in switches) * per_1k, 1),
    }
    return report


def _report(
    workers: int,
    runs: int,
    steps: int,
    api: dict[str, Any],
    reports: list[dict[str, Any]],
    cpu: list[float],
    pg: dict[str, Any] | None,
    effects: dict[str, Any],
) -> dict[str, Any]:
    total_steps = runs * steps
    per_1k = 1000 / total_steps
    workers_cpu, api_cpu = sum(cpu[:-1]), cpu[-1]
    pg_ours = pg["ours"] if pg else 0.0
    total = workers_cpu + api_cpu + pg_ours
    claims: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter(api["calls"])
    wakes: collections.Counter[str] = collections.Counter()
    trips: collections.Counter[str] = collections.Counter(api["round_trips"])
    rows: collections.Counter[str] = collections.Counter(api["rows"])
    for r in reports:
        rows.update(r.get("rows", {}))
        trips.update(r.get("round_trips", {}))
        claims.update(r.get("claims", {}))
        calls.update(r.get("calls", {}))
        wakes.update(r.get("wakes", {}))
    statements = api["statements"] + sum(int(r.get("statements", 0)) for r in reports)
    connections = len(api["server_pids"]) + sum(len(r.get("server_pids", [])) for r in reports)
    ok = api["completed"] == runs and not (
        effects["steps_executed_twice"]
        or effects["runs_executed_twice"]
        or effects["steps_missing"]
    )
    return {
        "workers": workers,
        "ok": ok,
        "completed": api["completed"],
        "failures": api["failures"],
        "result_read_errors": api["result_read_errors"],
        "result_read_error_sample": api["result_read_error_sample"],
        "cpu_per_1k_steps_s": round(total * per_1k, 4),
        "cpu_s": {
            "total": round(total, 3),
            "workers": round(workers_cpu, 3),
            "api": round(api_cpu, 3),
            "pg_our_backends": round(pg_ours, 3) if pg else None,
            "per_worker": [round(c, 3) for c in cpu[:-1]],
        },
        "pg_rest_cpu_s": round(pg["rest"], 3) if pg else None,
        "pg_connections_opened": connections,
        "pg_our_backends_exited": pg["our_backends_exited"] if pg else None,
        "pg_exit_check_s": {
            "exit_records": round(pg["exited_cpu_by_exit_records"], 3),
            "postmaster_cutime": round(pg["exited_cpu_by_cutime"], 3),
            "records_lost": pg["exit_records_lost"],
        }
        if pg
        else None,
        "wall_s": api["wall_s"],
        "submit_s": api["submit_s"],
        "steps_per_s": round(total_steps / api["wall_s"], 1),
        "statements_per_step": round(statements / total_steps, 3),
        "round_trips_per_1k_steps": {k: round(v * per_1k, 1) for k, v in sorted(trips.items())},
        "store_calls_per_1k_steps": {k: round(v * per_1k, 1) for k, v in sorted(calls.items())},
        "rows_read_per_1k_steps": {k: round(v * per_1k, 1) for k, v in sorted(rows.items())},
        "claims": dict(claims),
        "wakes_received": dict(wakes),
        "runs_per_worker": [r.get("completed") for r in reports],
        **effects,
    }


# ------------------------------------------------------------------------ the whole benchmark


def _workers_arg(values: list[str]) -> list[int]:
    counts = [int(v) for value in values for v in value.split(",") if v.strip()]
    counts = list(dict.fromkeys(counts))  # each count once, in the order given
    if not counts or any(c < 1 for c in counts):
        raise SystemExit(f"--workers: positive worker counts expected, got {values!r}")
    return counts


def _source() -> dict[str, Any]:
    """Which durably was measured: its directory and the git commit of the checkout."""
    path = os.path.dirname(durably.__file__)
    git = functools.partial(subprocess.run, capture_output=True, text=True, cwd=path, check=False)
    head = git(["git", "rev-parse", "HEAD"]).stdout.strip()
    dirty = git(["git", "status", "--porcelain", "--", "."]).stdout.strip()
    return {"path": path, "git_head": head or None, "uncommitted_changes": bool(dirty)}


def _median(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The repetition with the median CPU per 1,000 steps, and the main figures of all."""
    ordered = sorted(reps, key=lambda r: r["cpu_per_1k_steps_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    keys = ["cpu_per_1k_steps_s", "cpu_s", "wall_s", "pg_connections_opened", "claims"]
    keys += ["result_read_errors", "loadavg_1m"]
    chosen["all_reps"] = [{k: r[k] for k in keys} for r in reps]
    return chosen


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--workers", nargs="+", default=["1,2,4"], help="e.g. 1,2,4")
    parser.add_argument("--runs", type=int, default=1000, help="runs per configuration")
    parser.add_argument("--steps", type=int, default=20, help="no-op steps per run")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (the median is kept)")
    parser.add_argument("--pg-url", default=bench_common.DEFAULT_PG, help="PostgreSQL server")
    parser.add_argument("--note", help="a remark copied into the output (e.g. what was measured)")
    parser.add_argument(
        "--py-spy", metavar="DIR", help="also profile each worker over the window into DIR"
    )
    args = parser.parse_args()
    if args.role:
        role, *rest = args.role
        if role == "worker":
            await _worker_main(*rest)
        else:
            await _api_main(rest[0], int(rest[1]), int(rest[2]))
        return 0
    counts = _workers_arg(args.workers)
    if args.runs < 1 or args.steps < 1 or args.reps < 1:
        raise SystemExit("--runs, --steps and --reps must be at least 1")
    server = Server(args.pg_url)
    budget = await connection_budget(args.pg_url, counts)
    if budget["may_exceed"]:
        print(
            f"warning: {max(counts)} workers and the API process may open "
            f"{budget['ours_at_most']} connections; the server allows "
            f"{budget['max_connections']} and {budget['in_use_at_start']} are in use: some "
            "may be refused (lower pool_size/max_overflow in --pg-url)",
            file=sys.stderr,
        )
    # Repetitions outermost (1, 2, 4, 1, 2, 4, …): a change in the machine's other load
    # then hits every worker count alike instead of one of them.
    by_rep: dict[int, list[dict[str, Any]]] = {count: [] for count in counts}
    for rep in range(args.reps):
        for count in counts:
            schema = f"bench_workers_{os.getpid()}_{uuid.uuid4().hex[:8]}"
            url = bench_common.with_schema(args.pg_url, schema)
            print(f"rep {rep + 1}/{args.reps}: {count} worker(s) …", file=sys.stderr, flush=True)
            try:
                report = await measure(url, count, args.runs, args.steps, server, args.py_spy)
            finally:
                await drop_schema(args.pg_url, schema)
            report["loadavg_1m"] = bench_common.loadavg_1m()
            print(
                f"  cpu/1k steps {report['cpu_per_1k_steps_s']} s, wall {report['wall_s']} s",
                file=sys.stderr,
                flush=True,
            )
            by_rep[count].append(report)
    every_rep = [r for reps in by_rep.values() for r in reps]
    configs = [_median(by_rep[count]) for count in counts]
    by_count = {c["workers"]: c for c in configs}
    base = by_count.get(1)
    for config in configs:
        config["cpu_vs_1_worker"] = (
            round(config["cpu_per_1k_steps_s"] / base["cpu_per_1k_steps_s"], 3) if base else None
        )
    ratio = by_count[4]["cpu_vs_1_worker"] if base and 4 in by_count else None
    twice = sum(r["runs_executed_twice"] + r["steps_executed_twice"] for r in every_rep)
    ok = all(r["ok"] for r in every_rep)
    document = {
        "benchmark": "workers",
        "date": datetime.date.today().isoformat(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "calib_ms": bench_common.calib_ms(),
        },
        "durably_version": durably.__version__,
        "durably_source": _source(),
        "note": args.note,
        "settings": {
            "workers": counts,
            "runs": args.runs,
            "steps": args.steps,
            "reps": args.reps,
            "pg_url": re.sub(r"//([^:@/]*):[^@/]*@", r"//\1:…@", args.pg_url),
        },
        "method": (
            "CPU = user+system seconds over the window (the API's first start to its last "
            "result) of the worker processes, the API process and the PostgreSQL backends they "
            "opened (live ones from /proc, ones that exited in the window from the kernel's exit "
            "records). The rest of the server (auxiliary processes, other clients) is "
            "pg_rest_cpu_s, not counted: the server is shared with other work. Each "
            "configuration keeps the repetition with the median cpu_per_1k_steps_s."
        ),
        "pg_server_cpu": server.exit_accounting,
        "pg_connection_budget": budget,
        "configs": configs,
        "cpu_ratio_4_vs_1": ratio,
        "target_ratio": TARGET_RATIO,
        "target_met": None if ratio is None else ratio <= TARGET_RATIO,  # None: no 1 or 4
        "executed_twice": twice,
        "ok": ok,
    }
    if server.listener is not None:
        server.listener.close()
    print(json.dumps(document, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
