"""Steps on other processes: round trips, a wide fan and throughput over Redis and PostgreSQL,
with Celery 5 on the same Redis in the same run.

What is measured (each one a JSON line on stdout; progress on stderr; a summary line last):

* ``latency``: one workflow of ``--n`` sequential no-op steps over a transport (``redis``: the
  BullMQ transport; ``sql``: the PostgreSQL tables), its steps served by the engine itself
  (``server=self``: an engine with a transport serves its own registered steps) or by one
  separate ``python -m durably worker`` process (``server=worker``). Each step's round trip is
  timed inside the workflow around ``await ctx.step`` with ``time.perf_counter`` (the first
  measurement of each step wins, so a replay cannot add zeros); ``ckpt_p50_ms`` is the same
  from the checkpoints (``finished_at - enqueued_at``, whole milliseconds) as a cross-check. A
  warm-up workflow of ``--warmup`` steps runs first in the same processes.
* ``fan``: one workflow ``await ctx.all(noop, range(--fan))`` over Redis, served by one
  worker process (the engine serves no steps); ``wall_s`` from the start call to the result.
* ``throughput``: ``--runs`` runs of ``--steps`` no-op steps each, started at once, served by
  W = 1, 2, 4 worker processes (``--workers``); ``steps_per_s`` and CPU per 1,000 steps.
* ``celery``: the peer on the same Redis (``benchmarks/peers/celery/run.py`` in its own
  virtualenv): ``apply_async(...).get()`` round trips and a ``group(...)().get()`` of
  ``--fan`` tasks, one worker process.

Every measurement starts fresh processes (start-up is not measured) and, for the store, a
fresh PostgreSQL schema (``--store pg``, the default: a fleet whose steps run elsewhere shares
a durable store), a fresh SQLite file (``--store sqlite``, durably's default store, for an
engine that is the only writer) or an in-memory store (``--store memory``: the transport's own
cost). Worker processes are pure step workers (``role="worker"``, store ``memory``).

CPU (``cpu_s``, ``cpu_ms_per_step``) is user + system seconds over the measured window of
every process involved, read with psutil: the engine, the worker processes, the Redis server
and the PostgreSQL backends our processes opened (each process records the server pid of each
connection; backends that exit inside the window are read from the kernel's exit records,
``cpu_accounting.py``). Not counted: PostgreSQL's auxiliary processes and other clients'
backends, this orchestrator, and anything else on the machine. By default the benchmark starts
a private ``redis-server`` on a free loopback port, so its CPU is ours alone; ``--redis-url``
uses an existing server instead (then the server's CPU includes everyone's traffic).

The key comparison (durably's worker round trip and fan against Celery's) is repeated
``--reps`` times, interleaved durably / Celery, and the summary keeps the medians.
``--breakdown`` adds one engine serving its own steps over Redis with a timestamp at each stage
of a step's round trip (where the time goes). Every engine line has ``store_calls_per_step``
(the engine's store calls in the window, per step). ``--settle-read-limit N`` adds a fan whose
engine lists the run's rows only above N results per batch (a what-if of an engine change, set
from here). ``--baseline-src DIR`` runs each key measurement a second time, interleaved, with
durably imported from DIR (before/after comparisons; ``variant: baseline``). ``--py-spy DIR``
records each engine and worker process with ``py-spy`` during the measurements
(``--py-spy-bin``). ``docs/remote.md`` has the figures and the exact commands.

Usage::

    python benchmarks/remote.py                      # everything, 3 reps, defaults
    python benchmarks/remote.py --parts latency --n 1000 --store memory
    python benchmarks/remote.py --out benchmarks/results/2026-12-01-remote.jsonl
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
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any, ClassVar

import durably
from durably import WorkflowCtx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_common  # noqa: E402
import cpu_accounting  # noqa: E402

CELERY_DIR = HERE / "peers" / "celery"
NOOP = "bench.remote.noop"

# ------------------------------------------------------------------------ the workload

_LATENCY: dict[tuple[str, int], float] = {}  # (run id, step index) -> seconds, first wins


@durably.step(NOOP)
async def noop(x: int) -> int:
    return x


def _called(run_id: str, i: int) -> None:
    """A no-op, replaced by `Stages` (`--breakdown`) to mark when `ctx.step` is called."""


def _took(run_id: str, i: int, t0: float) -> None:
    # A replayed step returns at once; only its live round trip counts.
    _LATENCY.setdefault((run_id, i), time.perf_counter() - t0)


@durably.workflow("bench.remote.seq")
async def seq_wf(ctx: WorkflowCtx, n: int) -> int:
    for i in range(n):
        t0 = time.perf_counter()
        _called(ctx.run_id, i)
        await ctx.step(noop, i)
        _took(ctx.run_id, i, t0)
    return n


@durably.workflow("bench.remote.fan")
async def fan_wf(ctx: WorkflowCtx, n: int) -> int:
    values = await ctx.all(noop, list(range(n)))
    return sum(values)


@durably.workflow("bench.remote.few")
async def few_wf(ctx: WorkflowCtx, steps: int) -> int:
    x = 0
    for i in range(steps):
        x += await ctx.step(noop, i)
    return x


WORKFLOWS = [seq_wf, fan_wf, few_wf]

# ------------------------------------------------------------------------ in every process


def _record_pg_backends(path: str | None) -> None:
    """Append the server pid of every PostgreSQL connection this process opens to `path` (the
    store connects through SQLAlchemy, the SQL transport through an asyncpg pool: both build
    an `asyncpg.Connection`, which knows its backend's pid once constructed)."""
    if not path:
        return
    import asyncpg  # type: ignore[import-untyped]

    cls = asyncpg.connection.Connection
    real_init = cls.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        with contextlib.suppress(Exception):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{self.get_server_pid()}\n".encode())
            finally:
                os.close(fd)

    cls.__init__ = init


def _transport(kind: str, url: str, prefix: str) -> Any:
    if kind == "redis":
        from durably._transport.redis import RedisTransport

        return RedisTransport(url, prefix=prefix)
    from durably._transport.sql import SqlTransport

    return SqlTransport(url, prefix=prefix)


def worker_app() -> durably.Engine:
    """The app of `python -m durably worker -q remote:worker_app` (run in benchmarks/): a pure
    step worker serving the no-op step, configured by the environment the benchmark sets."""
    env = os.environ
    _record_pg_backends(env.get("DURABLY_BENCH_PG_PIDS"))
    transport = _transport(
        env["DURABLY_BENCH_TRANSPORT"], env["DURABLY_BENCH_URL"], env["DURABLY_BENCH_PREFIX"]
    )
    return durably.Engine("memory", transport=transport, role="worker", steps=[noop])


# ------------------------------------------------------------------------ stage marks


class Stages:
    """Timestamps at each stage of a step's round trip, in an engine that serves its own steps
    over Redis (one process, so one clock). Wraps the transport's methods; `--breakdown` only."""

    ORDER: ClassVar[list[str]] = [
        "called",  # the workflow calls `ctx.step`
        "dispatch",  # RedisTransport.dispatch called (the pending row is written)
        "queued",  # the task job is in Redis
        "fetched",  # the step server's BullMQ worker handed it to the server
        "handled",  # the handler returned; publishing the result starts
        "published",  # the result job is in Redis
        "result_fetched",  # the engine's results worker handed it to the batcher
        "sink_in",  # the batch reached ResultSettler.step_results
        "resumed",  # the workflow body continues after `await ctx.step`
    ]

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, float]] = collections.defaultdict(dict)
        from durably._engine.worker.settler import ResultSettler
        from durably._transport import redis as redis_mod
        from durably._transport import redis_results, redis_server

        mark = self.mark
        dispatch = redis_mod.RedisTransport.dispatch

        async def dispatched(transport: Any, task: Any) -> None:
            mark(task.step_id, "dispatch")
            await dispatch(transport, task)
            mark(task.step_id, "queued")

        serve = redis_server.RedisStepServer._process

        async def served(server: Any, job: Any) -> None:
            mark(_step_id(job.data), "fetched")
            await serve(server, job)

        publish = redis_server.RedisStepServer._publish

        async def published(server: Any, result: Any) -> None:
            mark(result.step_id, "handled")
            await publish(server, result)
            mark(result.step_id, "published")

        consume = redis_results.ResultConsumer._process

        async def consumed(consumer: Any, job: Any) -> None:
            mark(_step_id(job.data), "result_fetched")
            await consume(consumer, job)

        settle = ResultSettler.step_results

        async def settled(settler: Any, results: Any) -> None:
            for r in results:
                mark(r.step_id, "sink_in")
            await settle(settler, results)

        redis_mod.RedisTransport.dispatch = dispatched  # type: ignore[method-assign]
        redis_server.RedisStepServer._process = served  # type: ignore[method-assign]
        redis_server.RedisStepServer._publish = published  # type: ignore[method-assign]
        redis_results.ResultConsumer._process = consumed  # type: ignore[method-assign]
        ResultSettler.step_results = settled  # type: ignore[method-assign]
        global _took, _called

        def called(run_id: str, i: int) -> None:
            mark(f"{run_id}:{i}", "called")

        _called = called
        took = _took

        def took_and_mark(run_id: str, i: int, t0: float) -> None:
            took(run_id, i, t0)
            mark(f"{run_id}:{i}", "resumed")

        _took = took_and_mark

    def mark(self, step_id: str | None, stage: str) -> None:
        if step_id is not None:
            self.marks[step_id].setdefault(stage, time.perf_counter())

    def report(self, run_id: str) -> dict[str, Any]:
        rows = [
            m
            for sid, m in self.marks.items()
            if sid.startswith(run_id + ":") and all(k in m for k in self.ORDER)
        ]
        out: dict[str, Any] = {"steps": len(rows)}
        for a, b in zip(self.ORDER, self.ORDER[1:], strict=False):
            gaps = [(m[b] - m[a]) * 1000 for m in rows]
            out[f"{a}->{b}_p50_ms"] = round(statistics.median(gaps), 3) if gaps else None
        totals = [(m["resumed"] - m["called"]) * 1000 for m in rows]
        out["called->resumed_p50_ms"] = round(statistics.median(totals), 3) if totals else None
        return out


def _step_id(data: Any) -> str | None:
    return data.get("stepId") if isinstance(data, dict) else None


# ------------------------------------------------------------------------ the engine process


async def _engine_main(config: dict[str, Any]) -> None:
    """One engine: READY, then the command on stdin (GO), then DONE with its figures."""
    _record_pg_backends(config.get("pg_pids"))
    if config.get("settle_read_limit"):
        # What-if of an engine-side change, measured without editing the engine: above this
        # many results of one run in a batch, the settler lists ALL the run's rows (one read
        # instead of one per result); for a 10,000-member fan that listing is most of the
        # settlement's cost. A huge limit makes it read each result's row instead.
        from durably._engine.remote import steps as engine_remote

        engine_remote._LIST_OVER = int(config["settle_read_limit"])
    stages = Stages() if config.get("breakdown") else None
    transport = _transport(config["transport"], config["transport_url"], config["prefix"])
    steps = [noop] if config["server"] == "self" else []
    engine = durably.Engine(config["store"], transport=transport, workflows=WORKFLOWS, steps=steps)
    loop = asyncio.get_running_loop()
    calls = _count_store_calls(engine.store)
    async with engine:
        warmup = config.get("warmup", 0)
        if warmup:
            if config["op"] == "fan":
                handle = await engine.start(fan_wf, warmup, run_id="warmup")
            else:
                handle = await engine.start(seq_wf, warmup, run_id="warmup")
            await handle.result(timeout=300)
        print("READY", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # the parent's GO
        calls.clear()
        report: dict[str, Any] = {}
        if config["op"] == "latency":
            n = config["n"]
            _LATENCY.clear()
            t0 = time.perf_counter()
            handle = await engine.start(seq_wf, n, run_id="measured")
            value = await handle.result(timeout=600)
            report["wall_s"] = round(time.perf_counter() - t0, 4)
            latencies = [_LATENCY[k] * 1000 for i in range(n) if (k := ("measured", i)) in _LATENCY]
            report["ok"] = value == n and len(latencies) == n
            report.update(bench_common.latency_fields(latencies, digits=3))
            report["mean_ms"] = round(statistics.fmean(latencies), 3)
            rows = [cp for cp in await engine.store.list_checkpoints("measured")]
            spans = [
                (cp.finished_at - cp.enqueued_at).total_seconds() * 1000
                for cp in rows
                if cp.kind == "remote" and cp.enqueued_at is not None
            ]
            if spans:
                report["ckpt_p50_ms"] = round(statistics.median(spans), 1)
            if stages is not None:
                report["stages"] = stages.report("measured")
        elif config["op"] == "fan":
            n = config["n"]
            t0 = time.perf_counter()
            handle = await engine.start(fan_wf, n, run_id="measured")
            value = await handle.result(timeout=600)
            report["wall_s"] = round(time.perf_counter() - t0, 4)
            report["ok"] = value == n * (n - 1) // 2
        else:
            runs, steps_each = config["runs"], config["steps"]
            t0 = time.perf_counter()
            handles = await asyncio.gather(
                *(engine.start(few_wf, steps_each, run_id=f"r{i}") for i in range(runs))
            )
            report["submit_s"] = round(time.perf_counter() - t0, 4)
            values = [await h.result(timeout=600) for h in handles]
            report["wall_s"] = round(time.perf_counter() - t0, 4)
            expected = steps_each * (steps_each - 1) // 2
            report["ok"] = all(v == expected for v in values)
        steps = _steps_of(config)
        report["store_calls_per_step"] = {
            name: round(count / steps, 3) for name, count in sorted(calls.items())
        }
        print("DONE " + json.dumps(report), flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # the parent's EXIT


def _count_store_calls(store: Any) -> collections.Counter[str]:
    """Count the calls of every public coroutine method of the engine's store (each is one or
    a few statements; the figure shows what a step costs the store)."""
    calls: collections.Counter[str] = collections.Counter()
    for name in dir(type(store)):
        method = getattr(store, name, None)
        if name.startswith("_") or not asyncio.iscoroutinefunction(method):
            continue

        def counted(method: Any = method, name: str = name) -> Any:
            @functools.wraps(method)
            async def call(*args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                return await method(*args, **kwargs)

            return call

        setattr(store, name, counted())
    return calls


# ------------------------------------------------------------------------ the orchestrator


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    """The Redis server of the run: a private `redis-server` (default) or a given URL."""

    def __init__(self, url: str | None, workdir: str) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        if url is None:
            port = _free_port()
            binary = shutil.which("redis-server")
            if binary is None:
                raise SystemExit("redis-server is not installed; pass --redis-url")
            self.proc = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    workdir,
                    "--loglevel",
                    "warning",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            url = f"redis://127.0.0.1:{port}/0"
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                    break
                time.sleep(0.05)
            self.pid: int | None = self.proc.pid
            self.private = True
        else:
            self.pid = _listening_pid(urllib.parse.urlsplit(url).port or 6379)
            self.private = False
        self.url = url
        self.version = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.split()[2:3]

    def cleanup(self, prefix: str) -> None:
        """A shared server: delete the run's keys (a private one is thrown away whole)."""
        if self.private:
            return
        import redis as redis_py

        client = redis_py.Redis.from_url(self.url)
        try:
            for pattern in (f"{prefix}-*", f"bull:{prefix}-*"):
                for key in client.scan_iter(match=pattern, count=1000):
                    client.delete(key)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def _listening_pid(port: int) -> int | None:
    import psutil  # type: ignore[import-untyped]

    for conn in psutil.net_connections("tcp"):
        if conn.status == "LISTEN" and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None


def _cpu_s(pid: int | None) -> float:
    """User + system seconds of a process (all threads) so far; 0 if it is gone."""
    import psutil

    if pid is None:
        return 0.0
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


class PgServer:
    """The local PostgreSQL server whose backends' CPU is counted (None if not local)."""

    def __init__(self, pg_url: str) -> None:
        port = urllib.parse.urlsplit(pg_url).port or 5432
        self.postmaster = cpu_accounting.find_postmaster(port)
        self.listener: cpu_accounting.ExitListener | None = None
        self.exit_accounting = "no local server: the server's CPU is not counted"
        if self.postmaster is not None:
            self.listener, self.exit_accounting = cpu_accounting.exit_listener(self.postmaster)

    def meter(self) -> cpu_accounting.ServerCpu | None:
        if self.postmaster is None:
            return None
        return cpu_accounting.ServerCpu(self.postmaster, self.listener)


async def _drop_schema(pg_url: str, schema: str) -> None:
    from durably_runner import drop_schema

    await drop_schema(pg_url, schema)


async def _drop_transport_tables(pg_url: str, prefix: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(pg_url.split("?")[0])
    try:
        for table in ("tasks", "results"):
            await conn.execute(f'DROP TABLE IF EXISTS "{prefix}_transport_{table}" CASCADE')
            await conn.execute(f'DROP FUNCTION IF EXISTS "{prefix}_transport_{table}_notify"()')
    finally:
        await conn.close()


def _read_pids(path: str) -> set[int]:
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        return {int(line) for line in f if line.strip()}
    return set()


def _wait_for_text(path: str, text: str, proc: subprocess.Popen[Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError), open(path, errors="replace") as f:
            if text in f.read():
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def _spawn_worker(env: dict[str, str], log_path: str) -> subprocess.Popen[Any]:
    """A `durably worker` process serving the no-op step (its output to `log_path`)."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "durably", "worker", "-q", "remote:worker_app"],
            cwd=HERE,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _spawn_engine(config: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--role", "engine", json.dumps(config)],
        cwd=HERE,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _tail(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-500:]


def _append_lines(path: str, lines: list[dict[str, Any]]) -> None:
    with open(path, "a") as f:
        for ln in lines:
            f.write(json.dumps(ln) + "\n")


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: str) -> None:
        self.args = args
        self.workdir = workdir
        self.redis = Redis(args.redis_url, workdir)
        self.pg = PgServer(args.pg_url)
        self.lines: list[dict[str, Any]] = []

    def emit(self, line: dict[str, Any]) -> dict[str, Any]:
        line.setdefault("loadavg_1m", bench_common.loadavg_1m())
        if self.args.note:
            line["note"] = self.args.note
        print(json.dumps(line), flush=True)
        self.lines.append(line)
        return line

    # ---------------------------------------------------------------- one measurement

    async def measure(
        self,
        *,
        part: str,
        transport: str,
        server: str,
        workers: int,
        store: str,
        op: dict[str, Any],
        tag: str = "",
        src: str | None = None,
    ) -> dict[str, Any]:
        args = self.args
        hexid = uuid.uuid4().hex[:8]
        prefix = f"rb{hexid}"
        schema = f"bench_remote_{hexid}"
        if store == "pg":
            store_url = bench_common.with_schema(args.pg_url, schema)
        elif store == "sqlite":
            # The default store: one file, WAL, in this run's scratch directory.
            store_url = f"sqlite:///{os.path.join(self.workdir, f'store-{hexid}.db')}"
        else:
            store_url = "memory"
        transport_url = self.redis.url if transport == "redis" else args.pg_url
        pg_pids = os.path.join(self.workdir, f"pg-pids-{hexid}")
        line: dict[str, Any] = {
            "part": part,
            "impl": "durably",
            "transport": transport,
            "server": server,
            "workers": workers,
            "store": store,
            **{k: v for k, v in op.items() if k != "op"},
            "ok": False,
            "error": None,
            "loadavg_1m_start": bench_common.loadavg_1m(),
        }
        if src is not None:
            line["variant"] = "baseline"
            tag = f"baseline {tag}"
        print(f"{part} {tag}{transport}/{server}/{workers}w/{store} …", file=sys.stderr, flush=True)
        env = dict(
            os.environ,
            DURABLY_BENCH_TRANSPORT=transport,
            DURABLY_BENCH_URL=transport_url,
            DURABLY_BENCH_PREFIX=prefix,
            DURABLY_BENCH_PG_PIDS=pg_pids,
        )
        if src is not None:
            # The engine and the workers import durably from `src` (another checkout).
            env["PYTHONPATH"] = src
        procs: list[subprocess.Popen[Any]] = []
        logs = []
        engine: subprocess.Popen[str] | None = None
        spies: list[subprocess.Popen[Any]] = []
        try:
            # This loop only orchestrates (nothing else runs on it while it waits for the
            # children), so the blocking process and file calls below cost nothing.
            for i in range(workers):
                log_path = os.path.join(self.workdir, f"worker-{hexid}-{i}.log")
                logs.append(log_path)
                procs.append(_spawn_worker(env, log_path))
            for proc, log_path in zip(procs, logs, strict=True):
                if not _wait_for_text(log_path, " ready: ", proc, 60):
                    raise RuntimeError(f"a worker did not start: {_tail(log_path)}")
            config = {
                **op,
                "transport": transport,
                "transport_url": transport_url,
                "prefix": prefix,
                "store": store_url,
                "server": server,
                "pg_pids": pg_pids,
            }
            engine = _spawn_engine(config, env)
            if bench_common.read_line(engine, "READY", time.monotonic() + 300) is None:
                raise RuntimeError(f"the engine did not start (exit {engine.poll()})")
            pids = [engine.pid] + [p.pid for p in procs]
            spies = self._spies(pids, f"{part}-{tag}{transport}-{server}-{workers}w-{store}")
            meter = self.pg.meter() if store == "pg" or transport == "sql" else None
            if meter is not None:
                meter.start()
            cpu0 = [_cpu_s(p) for p in pids] + [_cpu_s(self.redis.pid)]
            assert engine.stdin is not None
            engine.stdin.write("GO\n")
            engine.stdin.flush()
            done = bench_common.read_line(engine, "DONE ", time.monotonic() + 900)
            cpu1 = [_cpu_s(p) for p in pids] + [_cpu_s(self.redis.pid)]
            if meter is not None:
                meter.stop()
            if done is None:
                raise RuntimeError(f"the engine did not finish (exit {engine.poll()})")
            report = json.loads(done.removeprefix("DONE "))
            line.update(report)
            steps = _steps_of(op)
            cpu = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
            pg_cpu = None
            if meter is not None:
                pg_cpu = meter.split(_read_pids(pg_pids))["ours"]
            total = sum(cpu) + (pg_cpu or 0.0)
            line["steps"] = steps
            line["steps_per_s"] = round(steps / report["wall_s"], 1)
            line["cpu_s"] = {
                "total": round(total, 3),
                "engine": round(cpu[0], 3),
                "workers": [round(c, 3) for c in cpu[1:-1]],
                "redis_server": round(cpu[-1], 3) if transport == "redis" else None,
                "pg_backends": round(pg_cpu, 3) if pg_cpu is not None else None,
            }
            if transport != "redis":
                line["cpu_s"]["total"] = round(total - cpu[-1], 3)
                total -= cpu[-1]
            line["cpu_ms_per_step"] = round(total / steps * 1000, 3)
            line["cpu_per_1k_steps_s"] = round(total / steps * 1000, 3)
        except Exception as exc:
            bench_common.record_error(line, exc)
        finally:
            for spy in spies:
                spy.send_signal(signal.SIGINT)
            if engine is not None:
                with contextlib.suppress(OSError):
                    assert engine.stdin is not None
                    engine.stdin.write("EXIT\n")
                    engine.stdin.close()
                try:
                    engine.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    engine.kill()
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for spy in spies:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    spy.wait(timeout=30)
            if store == "pg":
                await _drop_schema(args.pg_url, schema)
            if transport == "sql":
                await _drop_transport_tables(args.pg_url, prefix)
            self.redis.cleanup(prefix)
        return self.emit(line)

    def _spies(self, pids: list[int], tag: str) -> list[subprocess.Popen[Any]]:
        directory = self.args.py_spy
        if directory is None:
            return []
        os.makedirs(directory, exist_ok=True)
        names = ["engine"] + [f"worker{i}" for i in range(len(pids) - 1)]
        return [
            subprocess.Popen(
                [
                    self.args.py_spy_bin,
                    "record",
                    "--nonblocking",
                    "-r",
                    "500",
                    "-f",
                    "raw",
                    "--pid",
                    str(pid),
                    "-o",
                    os.path.join(directory, f"{tag}-{name}.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for pid, name in zip(pids, names, strict=True)
        ]

    def celery(self, mode: str, n: int) -> dict[str, Any]:
        args = self.args
        python = CELERY_DIR / ".venv" / "bin" / "python"
        line: dict[str, Any] = {"part": "celery", "impl": "celery", "mode": mode, "n": n}
        if not python.exists():
            line.update(ok=False, error=f"no {python}: run bash benchmarks/peers/celery/setup.sh")
            return self.emit(line)
        print(f"celery {mode} …", file=sys.stderr, flush=True)
        command = [str(python), str(CELERY_DIR / "run.py"), "--redis-url", self.redis.url]
        command += ["--mode", mode, "--n", str(n), "--warmup", str(args.warmup)]
        command += ["--pool", args.celery_pool, "--concurrency", str(args.celery_concurrency)]
        if self.redis.pid is not None:
            command += ["--redis-pid", str(self.redis.pid)]
        if not self.redis.private:
            command.append("--cleanup")
        out = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        found = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if not found:
            line.update(
                ok=False, error=f"no JSON line (exit {out.returncode}): {out.stderr[-500:]}"
            )
            return self.emit(line)
        line.update(json.loads(found[-1]))
        line["part"] = "celery"
        line["impl"] = "celery"
        return self.emit(line)


def _steps_of(op: dict[str, Any]) -> int:
    if op["op"] == "throughput":
        return int(op["runs"]) * int(op["steps"])
    return int(op["n"])


# ------------------------------------------------------------------------ the summary


def _median_of(lines: list[dict[str, Any]], key: str) -> float | None:
    values = [ln[key] for ln in lines if ln.get("ok") and ln.get(key) is not None]
    return round(statistics.median(values), 3) if values else None


def _summary(bench: Bench, args: argparse.Namespace, started: float) -> dict[str, Any]:
    lines = bench.lines
    groups: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for ln in lines:
        if ln["impl"] == "celery":
            key = f"celery/{ln['mode']}"
        elif ln["part"] == "throughput":
            key = f"throughput/{ln['transport']}/{ln['workers']}w/{ln['store']}"
        else:
            key = f"{ln['part']}/{ln['transport']}/{ln['server']}/{ln['store']}"
        if ln.get("variant"):
            key = f"{ln['variant']}:{key}"
        groups[key].append(ln)
    table: dict[str, Any] = {}
    for key, members in groups.items():
        entry: dict[str, Any] = {"reps": len(members), "ok": all(m.get("ok") for m in members)}
        for field in ("p50_ms", "p99_ms", "ckpt_p50_ms", "wall_s", "steps_per_s",
                      "tasks_per_s", "cpu_ms_per_step", "cpu_ms_per_task"):  # fmt: skip
            value = _median_of(members, field)
            if value is not None:
                entry[field] = value
        if len(members) > 1:
            for field in ("p50_ms", "wall_s"):
                values = [m[field] for m in members if m.get(field) is not None]
                if values:
                    entry[f"{field}_all"] = values
        table[key] = entry
    targets: dict[str, Any] = {}
    rtt = table.get("latency/redis/worker/pg", {}).get("p50_ms")
    rtt_self = table.get("latency/redis/self/pg", {}).get("p50_ms")
    celery_rtt = table.get("celery/rtt", {}).get("p50_ms")
    fan = table.get("fan/redis/worker/pg", {}).get("wall_s")
    if rtt is not None:
        targets["redis_p50_le_2ms"] = {"worker": rtt, "self": rtt_self, "met": rtt <= 2.0}
    if rtt is not None and celery_rtt is not None:
        targets["redis_p50_below_celery"] = {
            "durably": rtt,
            "celery": celery_rtt,
            "met": rtt < celery_rtt,
        }
    if fan is not None:
        targets["fan_10k_le_5s"] = {"wall_s": fan, "met": fan <= 5.0}
    return {
        "part": "summary",
        "impl": "summary",
        "benchmark": "remote",
        "date": datetime.date.today().isoformat(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "calib_ms": bench_common.calib_ms(),
        },
        "durably_version": durably.__version__,
        "durably_source": _source(),
        "redis": {
            "private_server": bench.redis.private,
            "version": (bench.redis.version or [None])[0],
        },
        "pg_server_cpu": bench.pg.exit_accounting,
        "settings": {k: v for k, v in vars(args).items() if k not in ("role", "out", "py_spy_bin")},
        "cpu_counted": (
            "user+system s over the measured window of: the engine process, the worker "
            "processes, the Redis server (redis transport) and the PostgreSQL backends our "
            "processes opened (pg store or sql transport); Celery: its client, its worker "
            "process tree and the same Redis server"
        ),
        "table": table,
        "targets": targets,
        "elapsed_s": round(time.monotonic() - started, 1),
        "ok": all(ln.get("ok") for ln in lines),
    }


def _source() -> dict[str, Any]:
    path = os.path.dirname(durably.__file__)
    git = functools.partial(subprocess.run, capture_output=True, text=True, cwd=path, check=False)
    head = git(["git", "rev-parse", "HEAD"]).stdout.strip()
    dirty = git(["git", "status", "--porcelain", "--", "."]).stdout.strip()
    return {"git_head": head or None, "uncommitted_changes": bool(dirty)}


# ------------------------------------------------------------------------ main


async def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    parts = set(args.parts.split(","))
    stores = args.store.split(",")
    with tempfile.TemporaryDirectory(prefix="durably-remote-") as workdir:
        bench = Bench(args, workdir)
        try:
            n, fan = args.n, args.fan
            lat = {"op": "latency", "n": n, "warmup": args.warmup}
            for rep in range(args.reps):
                print(f"== rep {rep + 1}/{args.reps}", file=sys.stderr, flush=True)
                # The key comparison, interleaved: durably's worker round trip, Celery's;
                # durably's fan, Celery's group.
                # With --baseline-src, the same measurement of the other checkout follows each
                # of durably's.
                for src in (None, args.baseline_src) if args.baseline_src else (None,):
                    if "latency" in parts:
                        await bench.measure(
                            part="latency",
                            transport="redis",
                            server="worker",
                            workers=1,
                            store=stores[0],
                            op=lat,
                            src=src,
                        )
                if "celery" in parts:
                    bench.celery("rtt", n)
                for src in (None, args.baseline_src) if args.baseline_src else (None,):
                    if "fan" in parts:
                        await bench.measure(
                            part="fan",
                            transport="redis",
                            server="worker",
                            workers=1,
                            store=stores[0],
                            op={"op": "fan", "n": fan, "warmup": 100},
                            src=src,
                        )
                if "celery" in parts and args.celery_group:
                    bench.celery("group", fan)
            for store in stores[1:]:
                if "fan" in parts:
                    await bench.measure(
                        part="fan",
                        transport="redis",
                        server="worker",
                        workers=1,
                        store=store,
                        op={"op": "fan", "n": fan, "warmup": 100},
                    )
            if "latency" in parts:
                for store in stores:
                    for transport, server in (
                        ("redis", "self"),
                        ("sql", "self"),
                        ("sql", "worker"),
                    ):
                        await bench.measure(
                            part="latency",
                            transport=transport,
                            server=server,
                            workers=1 if server == "worker" else 0,
                            store=store,
                            op=lat,
                        )
                    if store != stores[0]:
                        await bench.measure(
                            part="latency",
                            transport="redis",
                            server="worker",
                            workers=1,
                            store=store,
                            op=lat,
                        )
            if "throughput" in parts:
                op = {"op": "throughput", "runs": args.runs, "steps": args.steps, "warmup": 0}
                counts = [int(c) for c in args.workers.split(",")]
                for rep in range(args.throughput_reps):
                    for store in stores:
                        for count in counts:
                            await bench.measure(
                                part="throughput",
                                transport="redis",
                                server="worker",
                                workers=count,
                                store=store,
                                op=op,
                                tag=f"rep{rep + 1} ",
                            )
            if args.settle_read_limit and "fan" in parts:
                await bench.measure(
                    part="fan_whatif",
                    transport="redis",
                    server="worker",
                    workers=1,
                    store=stores[0],
                    op={
                        "op": "fan",
                        "n": fan,
                        "warmup": 100,
                        "settle_read_limit": args.settle_read_limit,
                    },
                )
            if args.breakdown:
                for store in stores:
                    await bench.measure(
                        part="breakdown",
                        transport="redis",
                        server="self",
                        workers=0,
                        store=store,
                        op={**lat, "breakdown": True},
                    )
        finally:
            bench.redis.stop()
            if bench.pg.listener is not None:
                bench.pg.listener.close()
        summary = bench.emit(_summary(bench, args, started))
    if args.out:
        _append_lines(args.out, bench.lines)
    return 0 if summary["ok"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--parts", default="latency,fan,throughput,celery")
    parser.add_argument("--n", type=int, default=1000, help="sequential steps (round trips)")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured steps first")
    parser.add_argument("--fan", type=int, default=10_000, help="members of the fan / group")
    parser.add_argument("--runs", type=int, default=500, help="throughput: concurrent runs")
    parser.add_argument("--steps", type=int, default=4, help="throughput: steps per run")
    parser.add_argument("--workers", default="1,2,4", help="throughput: worker processes")
    parser.add_argument("--reps", type=int, default=3, help="interleaved key repetitions")
    parser.add_argument("--throughput-reps", type=int, default=1)
    parser.add_argument(
        "--store", default="pg", help="pg, sqlite or memory, or several (pg,sqlite,memory)"
    )
    parser.add_argument("--pg-url", default=bench_common.DEFAULT_PG)
    parser.add_argument("--redis-url", help="use this Redis (default: a private redis-server)")
    parser.add_argument("--celery-pool", default="threads")
    parser.add_argument("--celery-concurrency", type=int, default=8)
    parser.add_argument(
        "--no-celery-group",
        dest="celery_group",
        action="store_false",
        help="skip Celery's group (about 20 s each)",
    )
    parser.add_argument("--breakdown", action="store_true", help="time each stage of a step")
    parser.add_argument(
        "--settle-read-limit",
        type=int,
        metavar="N",
        help="also run the fan with the engine's whole-run listing above N results per batch "
        "(an engine-side what-if; the engine's own value is 16)",
    )
    parser.add_argument("--py-spy", metavar="DIR", help="py-spy record the processes into DIR")
    parser.add_argument("--py-spy-bin", default="py-spy")
    parser.add_argument("--out", help="also append every JSON line to this file")
    parser.add_argument("--note", help="a remark copied into every line (what was measured)")
    parser.add_argument(
        "--baseline-src",
        metavar="DIR",
        help="also run each key measurement with durably imported from DIR (another "
        "checkout's src/), interleaved; its lines carry variant=baseline",
    )
    args = parser.parse_args()
    if args.role:
        asyncio.run(_engine_main(json.loads(args.role[1])))
        return 0
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
