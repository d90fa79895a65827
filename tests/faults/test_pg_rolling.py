"""Rolling restart: the old worker drains (SIGTERM → `engine.close()`, as `durably worker`
does) while the new one starts, with the same and with a different `instance_id` (compare
DBOS issues 804/805, where runs were left PENDING forever after such an overlap —
re-claimed by the draining process, or parked between two completed steps).

The new worker is spawned at the moment the old one gets SIGTERM. The old worker is capped at
`max_concurrent_runs=60` so a backlog is still pending when it drains; its runs take about 6.5 s
(8 steps of 800 ms), longer than the new worker's boot, so the two overlap, and its drain
timeout (3 s) is shorter than its turns still need, so those are cut mid-run and released.
Its lease is long (10 s): nothing may wait for it to lapse.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.pg_harness import (
    Worker,
    check_invariants,
    fresh_database,
    prepare,
    read_log,
    wait_for_lines,
    wait_terminal,
    workers_cleanup,
)

RUNS = 200
STEPS = 8


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "successor",
    [
        "new-instance",
        "same-instance",
    ],
)
async def test_rolling_restart(tmp_path: Path, successor: str) -> None:
    log = tmp_path / "effects.log"
    async with fresh_database() as url, workers_cleanup() as procs:
        ids = await prepare(url, RUNS, STEPS)
        old = Worker(
            url,
            log,
            tmp_path,
            "old",
            instance="worker-a",
            lease_ms=10_000,
            step_ms=800,
            max_concurrent=60,
            drain_ms=3000,
        )
        procs.append(old)
        await old.wait_ready()
        await wait_for_lines(
            log,
            lambda lines: sum(1 for ln in lines if ln.kind == "committed") >= 150,
            timeout=60,
            what="150 committed steps",
        )

        # the overlap: the new worker boots while the old one drains
        new = Worker(
            url,
            log,
            tmp_path,
            "new",
            instance="worker-a" if successor == "same-instance" else "worker-b",
            step_ms=100,
        )
        procs.append(new)
        old.sigterm()
        at_term = read_log(log)
        committed = sum(1 for ln in at_term if ln.kind == "committed")
        assert committed < RUNS * STEPS
        code = await old.wait_exit(timeout=30)
        assert code == 0 and "DRAINED" in old.stdout(), old.describe()

        await wait_terminal(url, ids, timeout=90, workers=procs)
        await new.drain_and_exit()
        lines = read_log(log)
        old_runs = {ln.run for ln in lines if ln.pid == old.pid}
        new_runs = {ln.run for ln in lines if ln.pid == new.pid}
        assert new_runs, "the new worker ran nothing"
        assert old_runs & new_runs, "no run cut by the drain was handed over to the new worker"
        print(
            f"  SIGTERM at {committed}/{RUNS * STEPS} committed steps; old ran "
            f"{len(old_runs)} runs, new {len(new_runs)}, both {len(old_runs & new_runs)}"
        )
        await check_invariants(
            url, log, ids, STEPS, workers=procs, label=f"rolling restart / {successor}"
        )
