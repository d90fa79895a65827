"""PostgreSQL restarted under a running engine: runs recover once it is back.

* Twice in a row while runs are in flight: the worker process keeps running through both
  restarts, reconnects, and finishes every run.
* While another process is recovering a dead worker's runs (DBOS issue 716: a database
  outage during recovery stranded the runs being recovered in PENDING forever).

Each test restarts a PostgreSQL server of its own (`own_postgres()`: initdb into a temporary
folder, a free port), never the machine's shared server, so these tests run beside the rest of
the suite.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faults.pg_harness import (
    Worker,
    check_invariants,
    fresh_database,
    own_postgres,
    prepare,
    read_log,
    restart_postgres,
    wait_for_lines,
    wait_terminal,
    workers_cleanup,
)

RUNS = 300
STEPS = 20
STEP_MS = 500  # a run takes at least 10 s, however fast the database: in flight across both


def _committed(log: Path) -> int:
    return sum(1 for ln in read_log(log) if ln.kind == "committed")


def _failed_saves(log: Path) -> int:
    return sum(1 for ln in read_log(log) if ln.kind == "failed")


def _store_failures(worker: Worker) -> int:
    err = worker.stderr()
    return err.count("the store failed during its turn") + err.count("Traceback")


@pytest.mark.timeout(180)
async def test_postgres_restarted_twice_while_runs_are_in_flight(tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    total = RUNS * STEPS
    async with own_postgres() as server:
        async with fresh_database(server.admin_url) as url, workers_cleanup() as procs:
            ids = await prepare(url, RUNS, STEPS)
            worker = Worker(url, log, tmp_path, "worker", instance="worker-a", step_ms=STEP_MS)
            procs.append(worker)
            await worker.wait_ready()

            restarts = []
            for round_ in (1, 2):
                # progress made since the start / since the previous restart (reconnected)
                floor = _committed(log) + total // 20
                await wait_for_lines(
                    log,
                    lambda lines, floor=floor: (
                        sum(1 for ln in lines if ln.kind == "committed") >= floor
                    ),
                    timeout=60,
                    what=f"{floor} committed steps before restart {round_}",
                )
                done = _committed(log)
                assert done < total, f"every step had committed before restart {round_}"
                failed_before = _failed_saves(log)
                took = await restart_postgres(server)
                # the restart hit checkpoint writes in flight (and the worker survived it)
                await wait_for_lines(
                    log,
                    lambda lines, n=failed_before: (
                        sum(1 for ln in lines if ln.kind == "failed") > n
                    ),
                    timeout=10,
                    what=f"a checkpoint write failed by restart {round_}",
                )
                restarts.append((done, took, _failed_saves(log) - failed_before))
                assert worker.alive, f"the worker died in restart {round_}\n{worker.describe()}"

            took = await wait_terminal(url, ids, timeout=90, workers=procs)
            assert worker.alive, worker.describe()
            failures = _store_failures(worker)
            await worker.drain_and_exit()
            await check_invariants(
                url, log, ids, STEPS, workers=procs, label="postgres restarted twice"
            )
            print(
                "  restarts at "
                + ", ".join(
                    f"{d}/{total} steps committed ({t:.1f}s, {u} checkpoint writes failed)"
                    for d, t, u in restarts
                )
                + f"; finished {took:.1f}s after the second; {failures} store errors logged"
            )


@pytest.mark.timeout(180)
async def test_postgres_restarted_while_another_process_recovers(tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    runs, steps = 200, 6
    async with own_postgres() as server:
        async with fresh_database(server.admin_url) as url, workers_cleanup() as procs:
            ids = await prepare(url, runs, steps)
            dead = Worker(
                url,
                log,
                tmp_path,
                "dead",
                instance="worker-a",
                step_ms=100,
                kill="in-step:400",
            )
            procs.append(dead)
            await dead.wait_killed(timeout=60)
            at_kill = _committed(log)

            recoverer = Worker(url, log, tmp_path, "recoverer", instance="worker-b", step_ms=100)
            procs.append(recoverer)
            await recoverer.wait_ready()
            # the dead worker's leases (1.5 s) lapse; restart as soon as recovery has begun
            t0 = time.monotonic()
            await wait_for_lines(
                log,
                lambda lines: any(ln.pid == recoverer.pid for ln in lines),
                timeout=30,
                what="the recoverer's first step",
            )
            recovering_for = time.monotonic() - t0
            mid = _committed(log)
            assert mid < runs * steps
            took = await restart_postgres(server)
            assert recoverer.alive, recoverer.describe()

            await wait_terminal(url, ids, timeout=90, workers=procs)
            await recoverer.drain_and_exit()
            await check_invariants(
                url, log, ids, steps, workers=procs, label="postgres restarted during recovery"
            )
            print(
                f"  killed at {at_kill}/{runs * steps} committed steps; restarted "
                f"({took:.1f}s) {recovering_for:.1f}s into recovery, at {mid} committed"
            )
