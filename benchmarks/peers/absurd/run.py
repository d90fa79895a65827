"""Absurd (``absurd-sdk``, PostgreSQL) runner for the benchmark workloads W1–W5.

Implements the runner contract of ``benchmarks/peers/README.md`` for the workloads of
``../shared/bench/WORKLOADS.md``: one invocation = one run = one fresh PostgreSQL database
(``absurd_bench_<pid>_<hex>`` on the server of ``--pg-url``, dropped afterwards) with the Absurd
schema installed from the SQL that ``absurdctl`` (same release as the SDK) bundles, and exactly
one JSON line on stdout.

Absurd idioms used (engine defaults unless listed in ``settings``):

* a workflow is an Absurd *task*, a step is ``ctx.step(name, fn)`` (its result is checkpointed);
  the driver spawns tasks with ``spawn(..., idempotency_key=<workflow id>)`` and observes them
  with ``await_task_result`` (the SDK's status poll, 50 ms doubling to 1 s);
* the worker is ``AsyncAbsurd.start_worker()`` in the driver process (defaults: concurrency 1,
  claim timeout 120 s, poll interval 0.25 s), on its own connection;
* W2: the parent spawns N child tasks ``leaf(i)`` on a second queue (``leaves``; the SDK refuses
  to await a task of the parent's own queue), all before waiting, then awaits each one with
  ``ctx.await_task_result`` (a checkpointed step) and sums; the leaf worker claims 100 tasks per
  round trip (``LEAF_BATCH``, default 1);
* W3: ``ctx.sleep_for`` (the task suspends; the run is re-scheduled in the database);
* W5: the synchronous ``Absurd`` worker (a thread pool, since step 5 blocks in
  ``time.sleep(2)``) with ``concurrency=100`` so that 50 workflows can be inside the slow step
  at once; worker B uses the same ``worker_id``. Absurd re-dispatches a run whose worker died
  only when its claim expires; W5 sets the claim timeout to 5 s (default 120 s, see
  ``W5_CLAIM_TIMEOUT``), so recovery includes that shorter wait.

Usage::

    benchmarks/peers/absurd/.venv/bin/python benchmarks/peers/absurd/run.py \\
        --backend postgres --workload w1 --n 200 --pg-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any

import absurd_sdk
import psycopg
from absurd_sdk import Absurd, AsyncAbsurd
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import bench_common

PEER = "absurd"
PEER_VERSION = version("absurd-sdk")
DEFAULT_PG = bench_common.DEFAULT_PG
DEFAULT_N = bench_common.DEFAULT_N
QUEUE = "default"
LEAF_QUEUE = "leaves"
# W2: the leaf worker claims up to this many leaves per round trip (`start_worker(batch_size=)`,
# default 1; concurrency stays 1). Absurd's best W2 figure, not its default one: with batch 1
# a 10,000-leaf fan took 75 s here, with 100 about 19 s (a larger concurrency changed nothing:
# one connection per client).
LEAF_BATCH = 100
W5_STEPS = bench_common.W5_STEPS
W5_INSTANCE = "w5-worker"
W5_CONCURRENCY = 100
# W5 only: Absurd re-dispatches a dead worker's task when its claim expires (default 120 s). A
# recovery-minded deployment shortens it; 5 s is the shortest that still covers the 2 s slow step
# with heartbeats at half the timeout (the SDK's rule), so Absurd's W5 figure is its best case and
# not a wait for a default we could have changed (issue #7 quotes "8 s, 123 s when a claim must
# time out").
W5_CLAIM_TIMEOUT = 5
SELF = os.path.abspath(__file__)


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------ helpers


def _schema_sql() -> str:
    """The Absurd schema of the installed release (``absurdctl`` bundles ``absurd.sql``)."""
    import absurdctl

    return str(absurdctl.BUNDLED_SCHEMA_SQL)


@contextlib.contextmanager
def fresh_database(pg_url: str) -> Any:
    """A new database with the Absurd schema and both queues; dropped afterwards."""
    name = f"absurd_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = make_conninfo(pg_url, dbname=name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(_schema_sql())  # multi-statement script: simple query protocol
            conn.execute("SELECT absurd.create_queue(%s)", (QUEUE,))
            conn.execute("SELECT absurd.create_queue(%s)", (LEAF_QUEUE,))
        yield url
    finally:
        with contextlib.suppress(Exception), psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ------------------------------------------------------------------------ W1–W4 (async)

_leaf_calls = 0


def build_app(url: str) -> tuple[AsyncAbsurd, AsyncAbsurd]:
    """The worker clients (one per queue, each with its own connection) with the tasks."""
    app = AsyncAbsurd(url, queue_name=QUEUE)
    leaves = AsyncAbsurd(url, queue_name=LEAF_QUEUE)

    async def inc(x: int) -> int:
        return x + 1

    @app.register_task("seq_wf")
    async def seq_wf(params: Any, ctx: Any) -> int:
        x = 0
        for _ in range(int(params["n"])):
            x = await ctx.step("inc", lambda v=x: inc(v))
        return x

    @app.register_task("timer_wf")
    async def timer_wf(params: Any, ctx: Any) -> int:
        await ctx.sleep_for("sleep", 1.0)
        return await ctx.step("inc", lambda: inc(0))

    @leaves.register_task("leaf")
    async def leaf(params: Any, ctx: Any) -> int:
        global _leaf_calls
        _leaf_calls += 1
        return int(params["i"]) + 1

    @app.register_task("fan_wf")
    async def fan_wf(params: Any, ctx: Any) -> int:
        n = int(params["n"])
        # launch all N children first (idempotent per parent and index, so a replay re-finds
        # them), then wait for each one in turn
        children = []
        for i in range(n):
            spawned = await app.spawn(
                "leaf",
                {"i": i},
                queue=LEAF_QUEUE,
                idempotency_key=f"{ctx.task_id}:leaf:{i}",
            )
            children.append(str(spawned["task_id"]))
        total = 0
        for task_id in children:
            snap = await ctx.await_task_result(task_id, queue_name=LEAF_QUEUE)
            if snap.state != "completed":
                raise RuntimeError(f"leaf {task_id} ended {snap.state}: {snap.failure}")
            total += int(snap.result)  # type: ignore[arg-type]
        return total

    return app, leaves


async def _result(client: AsyncAbsurd, task_id: str, timeout: float) -> Any:
    snap = await client.await_task_result(task_id, timeout=timeout)
    if snap.state != "completed":
        raise RuntimeError(f"task {task_id} ended {snap.state}: {snap.failure}")
    return snap.result


async def _many(
    driver: AsyncAbsurd,
    task: str,
    params: Any,
    n: int,
    prefix: str,
    expected: int,
    timeout: float,
    report: dict[str, Any],
) -> float:
    """N tasks spawned together; ``done_i`` = ``await_task_result`` of task i returned."""

    async def submit(i: int) -> Any:
        return await driver.spawn(task, params, queue=QUEUE, idempotency_key=f"{prefix}-{i}")

    async def wait(spawned: Any) -> Any:
        return await _result(driver, str(spawned["task_id"]), timeout)

    return await bench_common.run_many(
        submit, wait, n, expected, timeout, report, (TimeoutError, absurd_sdk.TimeoutError)
    )


async def _one(
    driver: AsyncAbsurd,
    task: str,
    n: int,
    expected: int,
    timeout: float,
    report: dict[str, Any],
) -> float:
    t0 = time.perf_counter()
    try:
        spawned = await driver.spawn(
            task, {"n": n}, queue=QUEUE, idempotency_key=f"{report['workload']}-0"
        )
        result = await asyncio.wait_for(_result(driver, str(spawned["task_id"]), timeout), timeout)
        report["ok"] = result == expected
        report["completed"] = 1
    except (TimeoutError, absurd_sdk.TimeoutError):
        report["timeout"] = True
        report["completed"] = 0
    return time.perf_counter() - t0


async def measured(url: str, workload: str, n: int, timeout: float, report: dict[str, Any]) -> None:
    app, leaves = build_app(url)
    driver = AsyncAbsurd(url, queue_name=QUEUE)
    workers = [
        asyncio.ensure_future(app.start_worker(worker_id=f"bench-{os.getpid()}")),
        asyncio.ensure_future(
            leaves.start_worker(worker_id=f"bench-leaves-{os.getpid()}", batch_size=LEAF_BATCH)
        ),
    ]
    try:
        await driver.list_queues()  # connect before the clock starts
        await asyncio.sleep(0.3)  # the workers have connected and are polling
        if workload == "w1":
            wall = await _many(driver, "seq_wf", {"n": 10}, n, "w1", 10, timeout, report)
            report.update(
                steps_per_s=round(n * 10 / wall, 1),
                wall_s=round(wall, 4),
                wf_per_s=round(n / wall, 1),
            )
        elif workload == "w3":
            wall = await _many(driver, "timer_wf", {}, n, "w3", 1, timeout, report)
            report.update(overhead_s=round(wall - 1.0, 4), wall_s=round(wall, 4))
        elif workload == "w2":
            wall = await _one(driver, "fan_wf", n, n * (n + 1) // 2, timeout, report)
            report["wall_s"] = round(wall, 4)
            if report["timeout"]:
                report["leaf_steps_done_at_timeout"] = _leaf_calls
        elif workload == "w4":
            wall = await _one(driver, "seq_wf", n, n, timeout, report)
            report.update(us_per_step=round(wall / n * 1e6, 1), wall_s=round(wall, 4))
    finally:
        for client in (app, leaves):
            client.stop_worker()
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for client in (app, leaves, driver):
            with contextlib.suppress(Exception):
                await client.close()


# ------------------------------------------------------------------------ W5 (sync worker)


def w5_worker(mode: str, url: str, log_path: str, ids_path: str, n: int, timeout: float) -> None:
    """Worker A (``start``: spawn N crash_wf tasks, then work until killed) or worker B
    (``recover``: work the same queue with the same worker id and await all N, ALLDONE)."""
    app = Absurd(url, queue_name=QUEUE)

    @app.register_task("crash_wf")
    def crash_wf(params: Any, ctx: Any) -> int:
        wf = str(params["wf"])
        x = 0
        for i in range(1, int(params["steps"]) + 1):
            x = ctx.step(f"s{i}", lambda i=i, x=x: bench_common.w5_step_effect(log_path, wf, i, x))
        return x

    if mode == "start":
        ids = {}
        for k in range(n):
            wf = f"w5-{k}"
            spawned = app.spawn("crash_wf", {"wf": wf, "steps": W5_STEPS}, idempotency_key=wf)
            ids[wf] = str(spawned["task_id"])
        with open(ids_path, "w") as f:
            json.dump(ids, f)
        print("STARTED", flush=True)
        app.start_worker(
            worker_id=W5_INSTANCE, concurrency=W5_CONCURRENCY, claim_timeout=W5_CLAIM_TIMEOUT
        )
        return

    with open(ids_path) as f:
        ids = json.load(f)
    worker = threading.Thread(
        target=app.start_worker,
        kwargs={
            "worker_id": W5_INSTANCE,
            "concurrency": W5_CONCURRENCY,
            "claim_timeout": W5_CLAIM_TIMEOUT,
        },
        daemon=True,
    )
    worker.start()
    print(f"LAUNCHED {time.time()}", flush=True)
    poller = Absurd(url, queue_name=QUEUE)  # its own connection
    deadline = time.monotonic() + timeout
    results: dict[str, Any] = {}
    for wf, task_id in ids.items():
        try:
            left = max(0.1, deadline - time.monotonic())
            snap = poller.await_task_result(task_id, timeout=left)
            results[wf] = snap.result if snap.state == "completed" else f"state {snap.state}"
        except Exception as exc:
            results[wf] = f"{type(exc).__name__}: {exc}"
    print(bench_common.alldone_line(results), flush=True)
    os._exit(0)  # the worker thread pool would otherwise keep polling


def _committed(url: str) -> set[tuple[str, int]]:
    """(workflow, step) pairs whose checkpoint is committed in the store."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT t.params->>'wf', c.checkpoint_name FROM absurd.c_{QUEUE} c"
            f" JOIN absurd.t_{QUEUE} t ON t.task_id = c.task_id WHERE c.status = 'committed'"
        ).fetchall()
    out = set()
    for wf, name in rows:
        if str(name).startswith("s") and str(name)[1:].isdigit():
            out.add((str(wf), int(str(name)[1:])))
    return out


def w5(url: str, directory: str, n: int, timeout: float, report: dict[str, Any]) -> None:
    log_path = os.path.join(directory, "side-effects.log")
    ids_path = os.path.join(directory, "ids.json")
    bench_common.create_log(log_path)

    def spawn(mode: str) -> subprocess.Popen[str]:
        cmd = [sys.executable, SELF, "--w5-worker", mode, "--url", url, "--log", log_path]
        cmd += ["--ids", ids_path, "--n", str(n), "--timeout", str(timeout)]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    # 1-2. A starts N runs; kill it once >= N/2 distinct runs logged the slow step (30 s cap)
    kill_offset = bench_common.kill_at_slow_step(spawn("start"), log_path, n, report)
    committed: set[tuple[str, int]] = set()
    with contextlib.suppress(Exception):
        committed = _committed(url)

    # 3. B: same code, same database, same worker id
    done, recovery = bench_common.recover_w5(lambda: spawn("recover"), timeout, report)
    bench_common.fill_w5_report(
        report, log_path, kill_offset, done, recovery, n, committed=committed
    )


# ------------------------------------------------------------------------ one run


def run(backend: str, workload: str, n: int, pg_url: str, timeout: float) -> dict[str, Any]:
    report = bench_common.new_report(PEER, PEER_VERSION, backend, workload, n)
    if workload == "w5":
        # needed for W5 to be expressible: 50 runs inside the blocking step at once
        report["settings"] = {
            "worker": "sync Absurd (thread pool)",
            "concurrency": W5_CONCURRENCY,
            "claim_timeout_s": W5_CLAIM_TIMEOUT,
        }
    if workload == "w2":
        report["settings"] = {"leaf_worker_batch_size": LEAF_BATCH}
    try:
        if backend != "postgres":
            raise ValueError(f"unknown backend {backend!r} (absurd runs on postgres only)")
        with tempfile.TemporaryDirectory(prefix="absurd-bench-") as directory:
            with fresh_database(pg_url) as url:
                if workload == "w5":
                    w5(url, directory, n, timeout, report)
                else:
                    asyncio.run(measured(url, workload, n, timeout, report))
    except Exception as exc:  # reported, not raised
        bench_common.record_error(report, exc)
    return bench_common.finish_report(report)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--describe", action="store_true")
    parser.add_argument("--backend", default="postgres")
    parser.add_argument("--workload", choices=sorted(DEFAULT_N), default="w1")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--timeout", type=float, default=540.0)
    parser.add_argument("--w5-worker", choices=["start", "recover"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.describe:
        print(json.dumps({"peer": PEER, "peer_version": PEER_VERSION, "backends": ["postgres"]}))
        return 0
    n = args.n if args.n is not None else DEFAULT_N[args.workload]
    if args.w5_worker:
        w5_worker(args.w5_worker, args.url, args.log, args.ids, n, args.timeout)
        return 0
    report = run(args.backend, args.workload, n, args.pg_url, args.timeout)
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
