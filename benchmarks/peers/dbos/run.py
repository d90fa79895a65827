"""One benchmark run of DBOS Transact: ONE workload (W1–W5 of WORKLOADS.md) on ONE backend.

The peer runner for ``benchmarks/matrix.py`` (contract: ``benchmarks/peers/README.md``); run it
with ``benchmarks/peers/dbos/.venv/bin/python`` (``setup.sh`` creates it with ``dbos==3.4.0``).
Each run is its own OS process with fresh durable state: a new SQLite system database file in a
temporary directory (``sqlite``), or a new PostgreSQL database ``dbos_bench_<pid>_<rand>`` on the
server of ``--pg-url``, dropped afterwards (``postgres``). DBOS is launched before the clock
starts (except in W5). It prints exactly one JSON line on stdout (DBOS's own output is sent to
stderr) and exits 0 when ``ok``.

Workloads, with the DBOS idioms WORKLOADS.md names (synchronous DBOS API, default settings):

* ``w1`` [200]: N ``seq_wf(10)`` (ten ``@DBOS.step()`` ``inc`` calls) started back to back with
  ``DBOS.start_workflow`` under ``SetWorkflowID("w1-<i>")``; ``done_i`` = done-callback of the
  in-process handle's future;
* ``w2`` [1000, 10000]: one ``fan_wf(N)`` = ``queue.enqueue(leaf, i)`` for every i on
  ``DBOS.register_queue("fanout")`` (defaults), then ``sum(h.get_result() for h in handles)``;
* ``w3`` [500]: N ``timer_wf()`` = ``DBOS.sleep(1)`` then ``inc(0)``; ``overhead_s``;
* ``w4`` [1000]: one ``seq_wf(N)``; ``us_per_step``;
* ``w5`` [100]: crash recovery; this process is the orchestrator: worker A (``--w5-worker
  start``) starts N ``crash_wf(10)`` and is SIGKILLed once N/2 runs logged step 5; worker B
  (``--w5-worker recover``, same system database, same ``executor_id``) calls ``DBOS.launch()``
  (which recovers the PENDING workflows of its executor) and polls every run's result with
  ``DBOS.retrieve_workflow(id).get_result()``.

Usage::

    benchmarks/peers/dbos/.venv/bin/python benchmarks/peers/dbos/run.py --describe
    benchmarks/peers/dbos/.venv/bin/python benchmarks/peers/dbos/run.py \\
        --backend postgres --workload w1 --pg-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.metadata
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dbos import DBOS, Queue, SetWorkflowID

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import bench_common

PEER = "dbos"
BACKENDS = ["sqlite", "postgres"]
DEFAULT_PG = bench_common.DEFAULT_PG
DEFAULT_N = bench_common.DEFAULT_N
APP_NAME = "durably-bench"
W5_STEPS = bench_common.W5_STEPS
W5_EXECUTOR = "w5-worker"
SELF = os.path.abspath(__file__)

# the real stdout (the JSON line / worker protocol lines); fd 1 itself is pointed at stderr so
# nothing DBOS or its dependencies print can be mistaken for the result line
_OUT = sys.stdout


def _claim_stdout() -> None:
    global _OUT
    saved = os.dup(1)
    os.dup2(2, 1)
    _OUT = os.fdopen(saved, "w", buffering=1)
    sys.stdout = sys.stderr


def _emit(line: str) -> None:
    _OUT.write(line + "\n")
    _OUT.flush()


def _version() -> str:
    try:
        return importlib.metadata.version("dbos")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# ------------------------------------------------------------------------ workflows

_leaf_lock = threading.Lock()
_leaf_calls = 0
_queue: Queue | None = None  # registered after launch (the queue lives in the system database)
_W5_LOG = os.devnull


@DBOS.step()
def inc(x: int) -> int:
    return x + 1


@DBOS.workflow()
def seq_wf(n: int) -> int:
    x = 0
    for _ in range(n):
        x = inc(x)
    return x


@DBOS.step()
def leaf(i: int) -> int:
    global _leaf_calls
    with _leaf_lock:
        _leaf_calls += 1
    return i + 1


@DBOS.workflow()
def fan_wf(n: int) -> int:
    assert _queue is not None
    handles = [_queue.enqueue(leaf, i) for i in range(n)]
    return sum(h.get_result() for h in handles)


@DBOS.workflow()
def timer_wf() -> int:
    DBOS.sleep(1)
    return inc(0)


@DBOS.step()
def w5_step(wf_id: str, i: int, x: int) -> int:
    """Log ``<wf_id> <i>`` with one O_APPEND write (survives SIGKILL), block 2 s in step 5."""
    return bench_common.w5_step_effect(_W5_LOG, wf_id, i, x)


@DBOS.workflow()
def crash_wf(steps: int) -> int:
    wf_id = DBOS.workflow_id
    assert wf_id is not None
    x = 0
    for i in range(1, steps + 1):
        x = w5_step(wf_id, i, x)
    return x


# ------------------------------------------------------------------------ helpers


def _admin_engine(pg_url: str) -> Any:
    import sqlalchemy as sa

    url = sa.make_url(pg_url).set(drivername="postgresql+psycopg")
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


@contextlib.contextmanager
def fresh_store(backend: str, pg_url: str, directory: str) -> Iterator[str]:
    """A DBOS system database URL with nothing in it: a new SQLite file, or a new PostgreSQL
    database (created here, dropped after)."""
    if backend == "sqlite":
        yield f"sqlite:///{os.path.join(directory, 'dbos_bench.sqlite')}"
        return
    import sqlalchemy as sa

    name = f"dbos_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = _admin_engine(pg_url)
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        url = sa.make_url(pg_url).set(database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        with contextlib.suppress(Exception), admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _config(url: str, executor_id: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"name": APP_NAME, "system_database_url": url}
    if executor_id is not None:
        config["executor_id"] = executor_id
    return config


@contextlib.contextmanager
def launched(url: str, executor_id: str | None = None) -> Iterator[None]:
    DBOS(config=_config(url, executor_id))  # type: ignore[arg-type]
    DBOS.launch()
    try:
        yield
    finally:
        DBOS.destroy(destroy_registry=False)


# ------------------------------------------------------------------------ W1 / W3


def _many(
    workflow: Callable[..., int],
    args: tuple[Any, ...],
    n: int,
    prefix: str,
    expected: int,
    timeout: float,
    report: dict[str, Any],
) -> float:
    """N workflows started back to back (a tight loop of ``DBOS.start_workflow``); ``done_i`` is
    the done-callback of each in-process handle's future. Fills the W1/W3 fields, returns the
    wall time ``max(done_i) - t0``."""
    subs: dict[int, float] = {}
    dones: dict[int, float] = {}
    results: dict[int, Any] = {}
    lock = threading.Lock()
    all_done = threading.Event()

    def callback(i: int) -> Callable[[concurrent.futures.Future[Any]], None]:
        def done(future: concurrent.futures.Future[Any]) -> None:
            now = time.perf_counter()
            try:
                value: Any = future.result()
            except BaseException as exc:
                value = f"{type(exc).__name__}: {exc}"
            with lock:
                dones[i] = now
                results[i] = value
                if len(dones) == n:
                    all_done.set()

        return done

    handles = []
    t0 = time.perf_counter()
    for i in range(n):
        subs[i] = time.perf_counter()
        with SetWorkflowID(f"{prefix}-{i}"):
            handle = DBOS.start_workflow(workflow, *args)
        handle.future.add_done_callback(callback(i))  # type: ignore[attr-defined]
        handles.append(handle)
    submit_s = time.perf_counter() - t0
    if not all_done.wait(max(0.0, timeout - submit_s)):
        report["timeout"] = True
    with lock:
        wall = (max(dones.values()) if len(dones) == n else time.perf_counter()) - t0
        latencies = [(dones[i] - subs[i]) * 1000 for i in dones]
        values = dict(results)
    ok = len(values) == n and all(v == expected for v in values.values())
    if ok:  # the return values through the handle API as well (after the clock)
        ok = all(h.get_result() == expected for h in handles)
    report["completed"] = sum(1 for v in values.values() if v == expected)
    report["ok"] = ok and not report["timeout"]
    if not ok and not report["error"]:
        bad = [v for v in values.values() if v != expected]
        report["error"] = f"{n - len(values)} not done, {len(bad)} wrong, e.g. {bad[:1]}"[:500]
    report["submit_s"] = round(submit_s, 4)
    report.update(bench_common.latency_fields(latencies))
    return wall


def w1(n: int, timeout: float, report: dict[str, Any]) -> None:
    wall = _many(seq_wf, (10,), n, "w1", 10, timeout, report)
    report.update(
        wall_s=round(wall, 4),
        wf_per_s=round(n / wall, 1),
        steps_per_s=round(n * 10 / wall, 1),
    )


def w3(n: int, timeout: float, report: dict[str, Any]) -> None:
    wall = _many(timer_wf, (), n, "w3", 1, timeout, report)
    report.update(wall_s=round(wall, 4), overhead_s=round(wall - 1.0, 4))


# ------------------------------------------------------------------------ W2 / W4


def _one(
    workflow: Callable[..., int], n: int, expected: int, timeout: float, report: dict[str, Any]
) -> float:
    t0 = time.perf_counter()
    with SetWorkflowID(f"{report['workload']}-0"):
        handle = DBOS.start_workflow(workflow, n)
    future: concurrent.futures.Future[Any] = handle.future  # type: ignore[attr-defined]
    try:
        future.result(timeout=max(0.0, timeout - (time.perf_counter() - t0)))
    except concurrent.futures.TimeoutError:
        report["timeout"] = True
        report["completed"] = 0
        return time.perf_counter() - t0
    result = handle.get_result()
    wall = time.perf_counter() - t0
    report["ok"] = result == expected
    report["completed"] = 1
    if not report["ok"]:
        report["error"] = f"returned {result!r}, expected {expected}"
    return wall


def w2(n: int, timeout: float, report: dict[str, Any]) -> None:
    wall = _one(fan_wf, n, n * (n + 1) // 2, timeout, report)
    report.update(wall_s=round(wall, 4), members_per_s=round(n / wall, 1))
    if report["timeout"]:
        report["leaf_steps_done_at_timeout"] = _leaf_calls


def w4(n: int, timeout: float, report: dict[str, Any]) -> None:
    wall = _one(seq_wf, n, n, timeout, report)
    report.update(
        wall_s=round(wall, 4), us_per_step=round(wall / n * 1e6, 1), steps_per_s=round(n / wall, 1)
    )


MEASURED: dict[str, Callable[[int, float, dict[str, Any]], None]] = {
    "w1": w1,
    "w2": w2,
    "w3": w3,
    "w4": w4,
}

# ------------------------------------------------------------------------ W5


def w5_worker(mode: str, url: str, log: str, n: int, timeout: float) -> None:
    """Worker A (``start``: start N runs, keep executing them until killed) or worker B
    (``recover``: same system database, same executor_id; ``DBOS.launch()`` recovers the
    PENDING runs; poll every result, print ALLDONE)."""
    global _W5_LOG
    _W5_LOG = log
    ids = bench_common.w5_ids(n)
    DBOS(config=_config(url, W5_EXECUTOR))  # type: ignore[arg-type]
    DBOS.launch()
    if mode == "start":
        for wf_id in ids:
            with SetWorkflowID(wf_id):
                DBOS.start_workflow(crash_wf, W5_STEPS)
        _emit("STARTED")
        time.sleep(3600)
        return
    _emit(f"LAUNCHED {time.time()}")
    deadline = time.monotonic() + timeout
    results: dict[str, Any] = {}

    def result_of(wf_id: str) -> Any:
        try:
            return DBOS.retrieve_workflow(wf_id).get_result()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)
    futures = {wf_id: pool.submit(result_of, wf_id) for wf_id in ids}
    for wf_id, future in futures.items():
        try:
            results[wf_id] = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            results[wf_id] = "timeout"
    _emit(bench_common.alldone_line(results))
    os._exit(0)  # do not wait for unfinished polling threads or DBOS shutdown


def _committed_w5_steps(url: str) -> set[tuple[str, int]] | None:
    """The w5_step checkpoints committed in the system database (read right after the kill).

    Steps of a run are sequential, so a run with k recorded ``w5_step`` outputs has committed
    steps 1..k."""
    import sqlalchemy as sa

    if url.startswith("sqlite"):
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        table = "operation_outputs"
    else:
        engine = sa.create_engine(
            sa.make_url(url).set(drivername="postgresql+psycopg"), poolclass=sa.pool.NullPool
        )
        table = "dbos.operation_outputs"
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    f"SELECT workflow_uuid, COUNT(*) FROM {table}"
                    " WHERE function_name LIKE :name AND error IS NULL GROUP BY workflow_uuid"
                ),
                {"name": "%w5_step"},
            ).all()
    except Exception as exc:
        print(f"could not read the checkpoints: {exc}", file=sys.stderr)
        return None
    finally:
        engine.dispose()
    return {(str(wf), i) for wf, count in rows for i in range(1, int(count) + 1)}


class _Lines:
    """Line reader over a child's stdout pipe with a deadline (select on the raw fd)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self._fd = proc.stdout.fileno()
        self._buf = b""
        self._eof = False

    def ready_line(self, prefix: str, deadline: float) -> str | None:
        """The first line starting with ``prefix`` before ``deadline`` (monotonic), else None."""
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                text = line.decode(errors="replace").strip()
                if text.startswith(prefix):
                    return text
            left = deadline - time.monotonic()
            if self._eof or left <= 0:
                return None
            readable, _, _ = select.select([self._fd], [], [], min(left, 0.05))
            if readable:
                chunk = os.read(self._fd, 65536)
                if not chunk:
                    self._eof = True
                self._buf += chunk


def _lines(proc: subprocess.Popen[bytes]) -> bench_common.LineReader:
    return _Lines(proc).ready_line


def w5(url: str, directory: str, n: int, timeout: float, report: dict[str, Any]) -> None:
    log = os.path.join(directory, "side-effects.log")
    bench_common.create_log(log)

    def spawn(mode: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                *(sys.executable, SELF, "--w5-worker", mode, "--url", url, "--log", log),
                *("--n", str(n), "--timeout", str(timeout)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    # 1-2. A starts N runs; once at least N/2 distinct runs logged the slow step (and A has
    # printed STARTED, so every run exists durably), SIGKILL A (30 s cap on the wait)
    kill_offset = bench_common.kill_at_slow_step(spawn("start"), log, n, report, lines=_lines)
    t_read = time.perf_counter()
    committed = _committed_w5_steps(url)
    report["checkpoint_read_ms"] = round((time.perf_counter() - t_read) * 1000, 1)

    # 3. B: same code, same system database, same executor_id
    done, recovery = bench_common.recover_w5(
        lambda: spawn("recover"), timeout, report, lines=_lines
    )
    bench_common.fill_w5_report(
        report, log, kill_offset, done, recovery, n, committed=committed, rerun_detail=True
    )


# ------------------------------------------------------------------------ one run


def run(backend: str, workload: str, n: int, pg_url: str, timeout: float) -> dict[str, Any]:
    report = bench_common.new_report(PEER, _version(), backend, workload, n)
    report["settings"] = {}  # DBOS defaults throughout
    try:
        with (
            tempfile.TemporaryDirectory(prefix="dbos-bench-") as directory,
            fresh_store(backend, pg_url, directory) as url,
        ):
            if workload == "w5":
                w5(url, directory, n, timeout, report)
            else:
                with launched(url):
                    if workload == "w2":
                        global _queue
                        _queue = DBOS.register_queue("fanout")
                    MEASURED[workload](n, timeout, report)
    except Exception as exc:  # reported, not raised: the matrix goes on
        bench_common.record_error(report, exc)
    return bench_common.finish_report(report)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--describe", action="store_true", help="print peer, version, backends")
    parser.add_argument("--backend", choices=BACKENDS, default="sqlite")
    parser.add_argument("--workload", choices=sorted(DEFAULT_N), default="w1")
    parser.add_argument("--n", type=int, default=None, help="size (default: per workload)")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="PostgreSQL server (fresh database)")
    parser.add_argument("--timeout", type=float, default=540.0, help="measured-phase timeout, s")
    parser.add_argument("--w5-worker", choices=["start", "recover"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    args = parser.parse_args()
    _claim_stdout()
    if args.describe:
        _emit(json.dumps({"peer": PEER, "peer_version": _version(), "backends": BACKENDS}))
        return 0
    n = args.n if args.n is not None else DEFAULT_N[args.workload]
    if args.w5_worker:
        w5_worker(args.w5_worker, args.url, args.log, n, args.timeout)
        return 0
    report = run(args.backend, args.workload, n, args.pg_url, args.timeout)
    _emit(json.dumps(report))
    # DBOS may leave non-daemon threads behind (e.g. after a timeout): do not wait for them
    _OUT.flush()
    os._exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    sys.exit(main())
