"""Singleton workflows across a fleet: three engine processes on one PostgreSQL store
(`tests/flow/singleton_fleet_process.py` is one of them) drive runs of two singleton keys.

Every assertion comes from the side-effect log the runs' steps write with wall-clock times
(one machine, one clock): between a run's first step and its last step (a durable sleep in
between) no other run of its key ever started, the runs of a key went in creation order,
and the other key was not held up by it.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import durably
from tests.flow.singleton_fleet_process import exclusive
from tests.pg_support import fresh_schema, schema_url
from tests.remote.worker_process import REPO, WorkerProcess, subprocess_env

pytestmark = pytest.mark.timeout(180)

RUNS_PER_KEY = 10


@contextmanager
def fleet(url: str, effects: Path, out_dir: Path, size: int) -> Iterator[list[WorkerProcess]]:
    procs = [
        WorkerProcess(
            [sys.executable, "-m", "tests.flow.singleton_fleet_process", url, str(effects)],
            out_dir / f"engine-{i}.out",
            cwd=REPO,
            env=subprocess_env(),
        )
        for i in range(size)
    ]
    try:
        for proc in procs:
            proc.wait_for_output("ready", 60)
        yield procs
    finally:
        for proc in procs:
            proc.stop(grace=10)


def _spans(effects: Path) -> dict[str, dict[str, tuple[float, float, set[str]]]]:
    """key -> run id -> (enter time, leave time, pids that ran its steps)."""
    seen: dict[str, dict[str, list[str]]] = {}
    for line in effects.read_text().splitlines():
        kind, run_id, key, at, pid = line.split()
        seen.setdefault(key, {}).setdefault(run_id, []).append(f"{kind} {at} {pid}")
    out: dict[str, dict[str, tuple[float, float, set[str]]]] = {}
    for key, by_run in seen.items():
        for run_id, notes in by_run.items():
            enters = [float(n.split()[1]) for n in notes if n.startswith("enter")]
            leaves = [float(n.split()[1]) for n in notes if n.startswith("leave")]
            pids = {n.split()[2] for n in notes}
            out.setdefault(key, {})[run_id] = (min(enters), max(leaves), pids)
    return out


@pytest.mark.parametrize("started", ["with-code", "by-name"])
async def test_three_engines_never_run_two_runs_of_one_key_at_once(
    tmp_path: Path, started: str
) -> None:
    """`with-code`: the client has the workflow, so each run is tagged with its key when it
    is created and the key's runs go in creation order. `by-name`: a client without the
    code; each run joins its key's line at its first turn (order not asserted), and still
    no two runs of a key ever overlap."""
    effects = tmp_path / "effects.log"
    async with fresh_schema(create=False) as schema:
        url = schema_url(schema, pool_size=4, max_overflow=4)
        async with durably.Client(url) as client:
            await client.list_runs()  # creates and migrates the schema before the fleet starts
            with fleet(url, effects, tmp_path, 3):
                handles = []
                for n in range(RUNS_PER_KEY):
                    for key in ("red", "blue"):
                        handles.append(
                            await client.start(
                                exclusive if started == "with-code" else "fleet.exclusive",
                                {"key": key},
                                run_id=f"{key}-{n:02d}",
                            )
                        )
                results = [await h.result(timeout=150) for h in handles]
    assert sorted(results) == sorted(["red", "blue"] * RUNS_PER_KEY)
    spans = _spans(effects)
    pids: set[str] = set()
    for key in ("red", "blue"):
        runs = spans[key]
        assert len(runs) == RUNS_PER_KEY
        ordered = sorted(runs.items(), key=lambda item: item[1][0])
        if started == "with-code":  # admitted in creation order (ids sort so)
            assert [run_id for run_id, _ in ordered] == sorted(runs)
        for (_, (_, end, _)), (_, (start, _, _)) in itertools.pairwise(ordered):
            assert start >= end, f"two runs of {key} overlapped"
        for _, _, ran_on in runs.values():
            pids |= ran_on
    # the keys ran side by side: some red run overlapped some blue run
    red = list(spans["red"].values())
    blue = list(spans["blue"].values())
    assert any(r[0] < b[1] and b[0] < r[1] for r in red for b in blue)
    assert len(pids) >= 2, pids  # more than one engine took part
