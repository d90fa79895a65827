"""SIGKILL of a worker process at each step boundary, then recovery by another process
(crash recovery through expired leases), on PostgreSQL.

A worker drives RUNS concurrent runs of a STEPS-step workflow and SIGKILLs itself at the K-th
occurrence of a boundary (so most runs are mid-flight): before a step starts, inside the step
(after its side effect), after the side effect but before its checkpoint commits, and between a
checkpoint and the next step. A second process recovers:

* with a different `instance_id`, once the dead worker's (short) lease lapsed;
* with the SAME `instance_id`, which must take its runs back at once: the dead worker's lease is
  60 s, far beyond the time the recovery is given.

Then the shared invariants hold (pg_harness.check_invariants), and the boundary is checked on the
run whose step the kill interrupted.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.faults.fault_app import BOUNDARIES
from tests.faults.pg_harness import (
    Line,
    Worker,
    check_invariants,
    fresh_database,
    kill_line,
    prepare,
    read_log,
    wait_terminal,
    workers_cleanup,
)

RUNS = 200
STEPS = 6
K = 450  # of RUNS * STEPS = 1200 occurrences: the kill lands mid-flight
SAME_INSTANCE_LEASE_MS = 60_000
SAME_INSTANCE_BOUND_S = 20.0


def _of(lines: list[Line], pid: int, run: str, n: int, kind: str) -> list[Line]:
    return [ln for ln in lines if (ln.pid, ln.run, ln.n, ln.kind) == (pid, run, n, kind)]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("recovery", ["new-instance", "same-instance"])
@pytest.mark.parametrize("boundary", BOUNDARIES)
async def test_sigkill_at_a_boundary_then_recover(
    tmp_path: Path, boundary: str, recovery: str
) -> None:
    same = recovery == "same-instance"
    log = tmp_path / "effects.log"
    async with fresh_database() as url, workers_cleanup() as procs:
        ids = await prepare(url, RUNS, STEPS)
        first = Worker(
            url,
            log,
            tmp_path,
            "first",
            instance="worker-a",
            lease_ms=SAME_INSTANCE_LEASE_MS if same else 1500,
            step_ms=100,
            kill=f"{boundary}:{K}",
        )
        procs.append(first)
        await first.wait_killed(timeout=60)

        # ---- the kill landed where it should, with many runs mid-flight
        kill = kill_line(log, first.pid)
        assert kill is not None and kill.extra == boundary, first.describe()
        before = read_log(log)
        started = {ln.run for ln in before if ln.kind == "effect"}
        commits: dict[str, int] = {}
        for ln in before:
            if ln.kind == "committed":
                commits[ln.run] = commits.get(ln.run, 0) + 1
        mid_flight = [rid for rid in started if commits.get(rid, 0) < STEPS]
        assert len(mid_flight) >= RUNS // 4, (
            f"only {len(mid_flight)} runs were mid-flight at the kill"
        )
        run, n = kill.run, kill.n
        effect_a = _of(before, first.pid, run, n, "effect")
        commit_a = _of(before, first.pid, run, n, "committed")
        if boundary == "before-step":
            assert not effect_a and not commit_a, (run, n, effect_a, commit_a)
        elif boundary in ("in-step", "before-commit"):
            assert len(effect_a) == 1 and not commit_a, (run, n, effect_a, commit_a)
        else:  # after-commit
            assert len(effect_a) == 1 and len(commit_a) == 1, (run, n, effect_a, commit_a)

        # ---- recovery by another process
        t0 = time.monotonic()
        second = Worker(
            url,
            log,
            tmp_path,
            "second",
            instance="worker-a" if same else "worker-b",
            lease_ms=1500,
        )
        procs.append(second)
        took = await wait_terminal(url, ids, timeout=90, workers=procs)
        if same:
            assert took < SAME_INSTANCE_BOUND_S, (
                f"the restarted instance took {took:.1f}s to finish its own runs: it did not "
                "take them back at once"
            )
        await second.drain_and_exit()
        report = await check_invariants(
            url, log, ids, STEPS, workers=procs, label=f"sigkill {boundary} / {recovery}"
        )

        # ---- the interrupted step on the recovering side
        after = read_log(log)
        effect_b = _of(after, second.pid, run, n, "effect")
        commit_b = _of(after, second.pid, run, n, "committed")
        if boundary == "after-commit":
            assert not effect_b and not commit_b, (run, n, effect_b, commit_b)
            if n + 1 < STEPS:
                assert _of(after, second.pid, run, n + 1, "effect"), (run, n + 1)
        else:  # never committed by the dead worker: the recovery runs it, exactly once
            assert len(effect_b) == 1 and len(commit_b) == 1, (run, n, effect_b, commit_b)
        assert report.pids[second.pid] >= len(mid_flight) // 2, report.details()
        print(
            f"  kill at {boundary} of {run} step {n}; {len(mid_flight)} runs mid-flight; "
            f"recovered in {time.monotonic() - t0:.1f}s by {recovery}"
        )
