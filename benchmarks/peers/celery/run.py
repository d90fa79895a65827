"""Celery 5 on Redis (broker and result backend): the peer of ``benchmarks/remote.py``.

Run by ``benchmarks/remote.py`` with this directory's virtualenv (``setup.sh`` creates it; it is
not committed). One invocation = one fresh ``celery worker`` process, one measurement, ONE JSON
line on stdout (logs on stderr):

* ``--mode rtt --n N``: N sequential round trips ``noop.apply_async((i,)).get()`` after
  ``--warmup`` unmeasured ones; ``p50_ms``/``p99_ms`` (nearest rank) of each call's time.
* ``--mode group --n N``: one ``group(noop.s(i) for i in range(N))().get()``; ``wall_s`` from
  just before the group is sent to the list of results (checked: their sum).

``cpu_s`` is user + system seconds over the measured window of this process (the client), the
worker's process tree (``psutil``, children included: the prefork pool's processes) and, with
``--redis-pid``, the Redis server.

Usage::

    benchmarks/peers/celery/.venv/bin/python benchmarks/peers/celery/run.py \\
        --redis-url redis://127.0.0.1:6379/0 --mode rtt --n 1000
    run.py --describe
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for the stdlib-only bench_common
import bench_common  # noqa: E402


def _cpu(pids: list[int]) -> float:
    """User + system seconds of these processes and all their live children."""
    import psutil

    total = 0.0
    seen: set[int] = set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            procs = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
    return total


def _start_worker(env: dict[str, str], pool: str, concurrency: int, log: Any) -> Any:
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "celery_app",
        "worker",
        "--pool",
        pool,
        "--concurrency",
        str(concurrency),
        "--loglevel",
        "WARNING",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-n",
        f"bench-{uuid.uuid4().hex[:6]}@%h",
    ]
    return subprocess.Popen(command, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT)


def _stop(proc: Any) -> None:
    proc.terminate()  # warm shutdown: finishes what it holds (nothing, here)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _cleanup(redis_url: str, queue: str) -> None:
    """The run's queue and result keys on a shared server (a private one is thrown away)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(queue)
        for key in client.scan_iter(match="celery-task-meta-*", count=1000):
            client.delete(key)
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--describe", action="store_true")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--redis-pid", type=int, help="count this Redis server's CPU too")
    parser.add_argument("--mode", choices=["rtt", "group"], default="rtt")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--pool", default="threads", help="celery worker --pool")
    parser.add_argument("--concurrency", type=int, default=8, help="celery worker --concurrency")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--cleanup", action="store_true", help="delete the run's keys after")
    args = parser.parse_args()
    import celery

    if args.describe:
        print(json.dumps({"peer": "celery", "peer_version": celery.__version__}))
        return 0
    queue = f"bench-remote-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, DURABLY_BENCH_REDIS=args.redis_url, DURABLY_BENCH_QUEUE=queue)
    os.environ.update(env)
    sys.path.insert(0, str(HERE))
    from celery import group
    from celery_app import app, noop

    report: dict[str, Any] = {
        "peer": "celery",
        "peer_version": celery.__version__,
        "mode": args.mode,
        "n": args.n,
        "ok": False,
        "error": None,
        "settings": {
            "pool": args.pool,
            "concurrency": args.concurrency,
            "broker": "redis",
            "result_backend": "redis",
            "prefetch_multiplier": app.conf.worker_prefetch_multiplier,
            "acks_late": app.conf.task_acks_late,
        },
        "loadavg_1m_start": bench_common.loadavg_1m(),
    }
    with tempfile.NamedTemporaryFile("w+", prefix="celery-worker-", suffix=".log") as log:
        worker = _start_worker(env, args.pool, args.concurrency, log)
        try:
            # The first answer proves the worker consumes the queue; start-up is not measured.
            noop.apply_async((0,)).get(timeout=120)
            for i in range(args.warmup):
                noop.apply_async((i,)).get(timeout=30)
            pids = [os.getpid(), worker.pid] + ([args.redis_pid] if args.redis_pid else [])
            cpu0 = _cpu(pids)
            t0 = time.perf_counter()
            if args.mode == "rtt":
                latencies = []
                for i in range(args.n):
                    t = time.perf_counter()
                    value = noop.apply_async((i,)).get(timeout=30)
                    latencies.append((time.perf_counter() - t) * 1000)
                    if value != i:
                        raise RuntimeError(f"task {i} returned {value!r}")
                wall = time.perf_counter() - t0
                report.update(bench_common.latency_fields(latencies, digits=3))
                report["ok"] = True
            else:
                values = group(noop.s(i) for i in range(args.n))().get(timeout=args.timeout)
                wall = time.perf_counter() - t0
                report["ok"] = sum(values) == args.n * (args.n - 1) // 2
            cpu = _cpu(pids) - cpu0
            report["wall_s"] = round(wall, 4)
            report["tasks_per_s"] = round(args.n / wall, 1)
            report["cpu_s"] = round(cpu, 3)
            report["cpu_ms_per_task"] = round(cpu / args.n * 1000, 3)
            report["cpu_counted"] = "client + worker tree" + (
                " + redis-server" if args.redis_pid else ""
            )
        except Exception as exc:
            bench_common.record_error(report, exc)
        finally:
            _stop(worker)
            log.seek(0)
            tail = log.read()[-2000:]
            if not report["ok"] and tail:
                print(tail, file=sys.stderr)
    if args.cleanup:
        _cleanup(args.redis_url, queue)
    report["loadavg_1m"] = bench_common.loadavg_1m()
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
