"""Scaffolding shared by the benchmark runners (durably's and the peers' ``run.py``).

The measurement helpers every runner repeats: the CPU calibration loop, peak RSS, the
nearest-rank percentile and the latency fields, the common head and tail of a run's JSON line,
and the W5 (crash recovery) machinery: the O_APPEND side-effect log, the kill of worker A once
half the runs are inside the slow step, the timed recovery of worker B and the analysis of the
log into the report's fields (see ``benchmarks/peers/README.md`` for the fields).

This module must stay **stdlib-only**: the peer runners import it by path from their own
virtualenvs (``benchmarks/peers/<peer>/.venv``), which do not have durably or its dependencies
installed. Runner-specific code (engines, stores, workflows) stays in the runners.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import math
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

DEFAULT_PG = os.environ.get("DURABLY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
DEFAULT_N = {"w1": 200, "w2": 1000, "w3": 500, "w4": 1000, "w5": 100}
W5_STEPS = 10
W5_SLOW_STEP = 5
W5_KILL_CAP_S = 30.0
W5_NOT_REACHED = "the kill condition was not reached within 30 s (killed anyway)"

LineReader = Callable[[str, float], "str | None"]

# ------------------------------------------------------------------------ measurements


def calib_ms() -> float:
    """Milliseconds for a 1,000,000-iteration pure-Python ``x += i`` loop (machine speed now)."""
    t0 = time.perf_counter()
    x = 0
    for i in range(1_000_000):
        x += i
    return round((time.perf_counter() - t0) * 1000, 1)


def peak_rss_mb() -> float:
    """This process's peak RSS in MiB (``getrusage(RUSAGE_SELF).ru_maxrss / 1024``)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def loadavg_1m() -> float:
    """The 1-minute load average, rounded to 2 decimals."""
    return round(os.getloadavg()[0], 2)


def percentile(
    values: list[float],
    p: float,
    *,
    rank: Callable[[float], int] = math.ceil,
    default: float | None = None,
) -> float:
    """The nearest-rank ``p``-th percentile: ``sorted(values)[max(1, rank(p/100 * len)) - 1]``.

    ``rank`` is ``math.ceil`` (the textbook nearest rank, used by the W1–W5 runners) or
    ``round`` (what ``sequential.py`` has always used). An empty ``values``
    returns ``default`` when one is given, else raises ``IndexError``."""
    ordered = sorted(values)
    if not ordered and default is not None:
        return default
    return ordered[max(1, rank(p / 100 * len(ordered))) - 1]


def latency_fields(
    values: list[float],
    *,
    prefix: str = "",
    digits: int = 2,
    rank: Callable[[float], int] = math.ceil,
) -> dict[str, float]:
    """``{<prefix>p50_ms, <prefix>p99_ms}`` of ``values`` (ms) rounded to ``digits``; ``{}`` if
    there are none."""
    if not values:
        return {}
    return {
        f"{prefix}p50_ms": round(percentile(values, 50, rank=rank), digits),
        f"{prefix}p99_ms": round(percentile(values, 99, rank=rank), digits),
    }


# ------------------------------------------------------------------------ the JSON line


def new_report(peer: str, peer_version: str, backend: str, workload: str, n: int) -> dict[str, Any]:
    """The head of a run's JSON line (the contract's common fields, before the clock starts)."""
    return {
        "peer": peer,
        "peer_version": peer_version,
        "backend": backend,
        "workload": workload,
        "n": n,
        "ok": False,
        "timeout": False,
        "error": None,
        "python": sys.version.split()[0],
        "loadavg_1m_start": loadavg_1m(),
        "calib_ms_start": calib_ms(),
    }


def record_error(report: dict[str, Any], exc: BaseException) -> None:
    """A failed run: ``ok`` false and the exception as ``error`` (reported, not raised)."""
    report["ok"] = False
    report["error"] = f"{type(exc).__name__}: {exc}"[:500]


def finish_report(report: dict[str, Any]) -> dict[str, Any]:
    """The tail of a run's JSON line: ``peak_rss_mb`` (this process's, unless a worker's was
    recorded), ``calib_ms_end`` and ``loadavg_1m``. Returns ``report``."""
    if report.get("peak_rss_mb") is None:
        report["peak_rss_mb"] = peak_rss_mb()
    report["calib_ms_end"] = calib_ms()
    report["loadavg_1m"] = loadavg_1m()
    return report


def with_schema(pg_url: str, schema: str) -> str:
    """``pg_url`` with a ``schema=`` query parameter (durably's per-run PostgreSQL schema)."""
    return f"{pg_url}{'&' if '?' in pg_url else '?'}schema={schema}"


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median ``wall_s``, plus ``reps``, ``wall_s_min`` and ``wall_s_max``."""
    ordered = sorted(runs, key=lambda r: r["wall_s"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen.update(reps=len(runs), wall_s_min=ordered[0]["wall_s"], wall_s_max=ordered[-1]["wall_s"])
    return chosen


# ------------------------------------------------------------------------ W1 / W3


async def run_many(
    submit: Callable[[int], Awaitable[Any]],
    wait: Callable[[Any], Awaitable[Any]],
    n: int,
    expected: int,
    timeout: float,
    report: dict[str, Any],
    timeout_errors: tuple[type[BaseException], ...] = (TimeoutError,),
) -> float:
    """N workflows submitted together (asyncio tasks started at once); fills the W1/W3 fields
    (``completed``, ``ok``, ``submit_s``, ``p50_ms``/``p99_ms``, ``timeout``).

    ``submit(i)`` starts workflow ``i`` and returns what ``wait`` turns into its result.
    Latency ``i`` is from just before ``submit(i)`` to its result. Returns the wall time
    ``max(done_i) - t0`` (or the time now, if not all finished)."""
    subs: dict[int, float] = {}
    dones: dict[int, float] = {}
    results: dict[int, Any] = {}
    submitted: list[float] = []

    async def one(i: int) -> None:
        subs[i] = time.perf_counter()
        handle = await submit(i)
        submitted.append(time.perf_counter())
        results[i] = await wait(handle)
        dones[i] = time.perf_counter()

    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    except timeout_errors:
        report["timeout"] = True
    wall = (max(dones.values()) if len(dones) == n else time.perf_counter()) - t0
    latencies = [(dones[i] - subs[i]) * 1000 for i in dones]
    report["completed"] = len(dones)
    report["ok"] = len(results) == n and all(v == expected for v in results.values())
    report["submit_s"] = round(max(submitted) - t0, 4) if submitted else None
    report.update(latency_fields(latencies))
    return wall


# ------------------------------------------------------------------------ W5: the side-effect log


def w5_ids(n: int) -> list[str]:
    """The W5 workflow ids ``w5-0`` … ``w5-<n-1>``."""
    return [f"w5-{i}" for i in range(n)]


def create_log(path: str) -> None:
    """Create (or empty) the side-effect log."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))


def append_log_line(path: str, line: str) -> None:
    """Append ``line`` + newline with one ``os.write`` on an O_APPEND fd (survives SIGKILL)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def w5_step_effect(log_path: str, wf: str, i: int, x: int) -> int:
    """The body of the W5 step: log ``<wf> <i>``, block 2 s in the slow step, return ``x + 1``."""
    append_log_line(log_path, f"{wf} {i}")
    if i == W5_SLOW_STEP:
        time.sleep(2)  # a blocking sleep inside the step, not a durable timer
    return x + 1


def read_log(path: str) -> bytes:
    """The side-effect log (small: N x 10 short lines, read synchronously)."""
    with open(path, "rb") as f:
        return f.read()


def log_pairs(data: bytes) -> list[tuple[str, int]]:
    """The ``(workflow id, step)`` pairs of the log, in order, one per execution."""
    pairs = []
    for line in data.decode().splitlines():
        parts = line.split()
        if len(parts) == 2:
            pairs.append((parts[0], int(parts[1])))
    return pairs


def kill_condition_reached(log_path: str, n: int) -> bool:
    """At least N/2 distinct runs have logged the slow step (the moment to SIGKILL worker A)."""
    in_slow = {wf for wf, i in log_pairs(read_log(log_path)) if i == W5_SLOW_STEP}
    return len(in_slow) >= n // 2


def alldone_line(results: dict[str, Any]) -> str:
    """Worker B's last line: ``ALLDONE {"results": …, "peak_rss_mb": …}``."""
    return "ALLDONE " + json.dumps({"results": results, "peak_rss_mb": peak_rss_mb()})


# ------------------------------------------------------------------------ W5: worker processes


def read_line(proc: subprocess.Popen[str], prefix: str, deadline: float) -> str | None:
    """The first stdout line of ``proc`` (a text-mode pipe) starting with ``prefix``, stripped;
    None at EOF or at ``deadline`` (``time.monotonic()``). Reads on a daemon thread."""
    box: list[str | None] = [None]

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(prefix):
                box[0] = line.strip()
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(max(0.0, deadline - time.monotonic()))
    return box[0]


def thread_lines(proc: subprocess.Popen[Any]) -> LineReader:
    """The default line reader of a worker: ``read_line`` on ``proc``'s stdout."""
    return functools.partial(read_line, proc)


def kill_at_slow_step(
    proc: subprocess.Popen[Any],
    log_path: str,
    n: int,
    report: dict[str, Any],
    lines: Callable[[subprocess.Popen[Any]], LineReader] = thread_lines,
) -> int:
    """W5 steps 1-2: once worker A printed ``STARTED`` (every run exists durably) and at least
    N/2 runs logged the slow step, SIGKILL it (a 30 s cap on the wait; if the condition was not
    reached, ``error`` says so and A is killed anyway). Returns the log's size at the kill."""
    read = lines(proc)
    cap = time.monotonic() + W5_KILL_CAP_S
    reached = False
    try:
        if read("STARTED", cap) is not None:
            while time.monotonic() < cap and proc.poll() is None:
                if kill_condition_reached(log_path, n):
                    reached = True
                    break
                time.sleep(0.01)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        proc.wait()
    kill_offset = len(read_log(log_path))
    if not reached:
        report["error"] = W5_NOT_REACHED
    return kill_offset


def recover_w5(
    spawn: Callable[[], subprocess.Popen[Any]],
    timeout: float,
    report: dict[str, Any],
    lines: Callable[[subprocess.Popen[Any]], LineReader] = thread_lines,
) -> tuple[str | None, float]:
    """W5 step 3: spawn worker B and time it: ``restart_to_launched_s`` (spawn → ``LAUNCHED``)
    and the recovery (spawn → ``ALLDONE``), bounded by ``timeout``. Returns the ALLDONE line
    (None if it did not come) and the recovery time in seconds."""
    t_spawn = time.monotonic()
    proc = spawn()
    deadline = t_spawn + timeout
    read = lines(proc)
    launched = read("LAUNCHED", deadline)
    if launched is not None:
        report["restart_to_launched_s"] = round(time.monotonic() - t_spawn, 4)
    done = read("ALLDONE", deadline) if launched is not None else None
    recovery = time.monotonic() - t_spawn
    if done is None:
        report["timeout"] = time.monotonic() >= deadline
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    proc.wait()
    return done, recovery


# ------------------------------------------------------------------------ W5: the analysis


def fill_w5_report(
    report: dict[str, Any],
    log_path: str,
    kill_offset: int,
    done: str | None,
    recovery: float,
    n: int,
    *,
    committed: set[tuple[str, int]] | None = None,
    rerun_detail: bool = False,
) -> None:
    """The W5 fields from the side-effect log, worker B's ALLDONE line and (when the runner can
    read its store) the ``(workflow, step)`` pairs committed at the kill; sets ``ok``.

    Always: ``recovery_s``, ``completed``, ``dup_pairs``, ``dup_extra_executions``,
    ``dup_pairs_by_step``, ``missing_pairs``, ``never_finished``, ``wrong_result``,
    ``wfs_inside_slow_step_at_kill``, ``wfs_past_slow_step_at_kill``,
    ``steps_logged_before_kill``, ``orchestrator_peak_rss_mb``, ``peak_rss_mb`` (worker B's).
    With ``committed``: ``steps_in_flight_at_kill`` (logged before the kill, not committed),
    ``committed_steps_at_kill``, ``reran_committed_steps``. With ``rerun_detail``:
    ``dup_pairs_not_last_started`` and, with ``committed`` too, ``reran_steps_not_in_flight``
    and ``reruns_within_in_flight``."""
    payload: dict[str, Any] = json.loads(done.removeprefix("ALLDONE ")) if done else {}
    results: dict[str, Any] = payload.get("results", {})
    data = read_log(log_path)
    before = log_pairs(data[:kill_offset])
    counts = collections.Counter(log_pairs(data))
    last_before: dict[str, int] = {}
    for wf, i in before:
        last_before[wf] = max(i, last_before.get(wf, 0))
    ids = w5_ids(n)
    dup_by_step: collections.Counter[int] = collections.Counter()
    not_last_started = 0  # a re-run of a step that was not the last one a run had started
    for (wf, i), c in counts.items():
        if c > 1:
            dup_by_step[i] += 1
            if last_before.get(wf) != i:
                not_last_started += 1
    missing = [(wf, i) for wf in ids for i in range(1, W5_STEPS + 1) if counts[(wf, i)] == 0]
    never = [wf for wf in ids if not isinstance(results.get(wf), int)]
    wrong = [wf for wf in ids if isinstance(results.get(wf), int) and results[wf] != W5_STEPS]
    extra = sum(c - 1 for c in counts.values() if c > 1)
    report.update(
        recovery_s=round(recovery, 4),
        completed=sum(1 for wf in ids if results.get(wf) == W5_STEPS),
        dup_pairs=sum(dup_by_step.values()),
        dup_extra_executions=extra,
        dup_pairs_by_step={str(k): v for k, v in sorted(dup_by_step.items())},
    )
    if rerun_detail:
        report["dup_pairs_not_last_started"] = not_last_started
    report.update(
        missing_pairs=len(missing),
        never_finished=len(never),
        wrong_result=len(wrong),
        wfs_inside_slow_step_at_kill=sum(1 for v in last_before.values() if v == W5_SLOW_STEP),
        wfs_past_slow_step_at_kill=sum(1 for v in last_before.values() if v > W5_SLOW_STEP),
        steps_logged_before_kill=len(before),
    )
    verdict: bool | None = None
    if committed is not None:
        in_flight = {pair for pair in set(before) if pair not in committed}
        report.update(
            steps_in_flight_at_kill=len(in_flight),
            committed_steps_at_kill=len(committed),
            reran_committed_steps=sum(1 for p, c in counts.items() if c > 1 and p in committed),
        )
        if rerun_detail:
            not_in_flight = sum(1 for p, c in counts.items() if c > 1 and p not in in_flight)
            report["reran_steps_not_in_flight"] = not_in_flight
            verdict = not_in_flight == 0 and extra <= len(in_flight)
    report.update(orchestrator_peak_rss_mb=peak_rss_mb(), peak_rss_mb=payload.get("peak_rss_mb"))
    if never and not report["error"]:
        report["error"] = f"{len(never)} runs not done, e.g. {never[0]}: {results.get(never[0])}"
    report["ok"] = not (missing or never or wrong) and done is not None
    if verdict is not None:
        report["reruns_within_in_flight"] = verdict
