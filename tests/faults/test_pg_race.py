"""Two engines racing to recover the same orphaned runs: two instances recovering the same
store never both run a run (compare DBOS issue 742, where a recovery working from a stale
list of pending workflows executed work it had not claimed).

A worker is SIGKILLed with most runs mid-flight; two recovering processes (different
`instance_id`s) then open at the same wall-clock moment, after the dead worker's leases lapsed,
so their boot recoveries race over the same orphans. The recoverers see the database with 3 ms
of extra latency per call (a database in another zone), so how long a recovery pass takes
relative to a run does not hinge on how fast the local server happens to be.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest

from tests.faults.pg_harness import (
    Worker,
    check_invariants,
    fresh_database,
    prepare,
    read_log,
    wait_terminal,
    workers_cleanup,
)

RUNS = 300
STEPS = 6
DB_LATENCY_MS = 3  # the recoverers' database is 3 ms away (see fault_app.FaultStore)


@pytest.mark.timeout(150)
async def test_two_engines_race_to_recover_the_same_orphans(tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    async with fresh_database() as url, workers_cleanup() as procs:
        ids = await prepare(url, RUNS, STEPS)
        dead = Worker(
            url, log, tmp_path, "dead", instance="worker-a", step_ms=50, kill="in-step:600"
        )
        procs.append(dead)
        await dead.wait_killed(timeout=60)
        at_kill = read_log(log)
        done = collections.Counter(ln.run for ln in at_kill if ln.kind == "committed")
        orphans = {ln.run for ln in at_kill if done[ln.run] < STEPS}
        assert len(orphans) >= RUNS // 4, f"only {len(orphans)} runs were mid-flight"

        # both open at the same moment, once the dead worker's 1.5 s leases have lapsed
        start_at = time.time() + 2.5
        racers = [
            Worker(
                url,
                log,
                tmp_path,
                name,
                instance=name,
                step_ms=10,
                start_at=start_at,
                db_latency_ms=DB_LATENCY_MS,
            )
            for name in ("recover-1", "recover-2")
        ]
        procs.extend(racers)
        await wait_terminal(url, ids, timeout=90, workers=procs)
        for racer in racers:
            await racer.drain_and_exit()
        # two live engines: a run is executed by one of them only (it never moves while both
        # are alive, since every run finishes in the turn that picked it up)
        lines = read_log(log)
        by = {racer.pid: {ln.run for ln in lines if ln.pid == racer.pid} for racer in racers}
        both = by[racers[0].pid] & by[racers[1].pid]
        assert not both, f"runs executed by both live recoverers: {sorted(both)[:10]}"
        got = [len(by[racer.pid] & orphans) for racer in racers]
        ready = [float(racer.stdout().split("READY ")[1].split()[1]) for racer in racers]
        assert abs(ready[0] - ready[1]) < 1.0, f"the recoverers did not open together: {ready}"
        print(f"  {len(orphans)} orphans recovered {got[0]} / {got[1]}")
        await check_invariants(
            url, log, ids, STEPS, workers=procs, label="two engines racing to recover"
        )
