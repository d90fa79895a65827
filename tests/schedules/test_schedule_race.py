"""Engine processes racing over the same schedules: every window fires exactly once.

Three engine processes on one PostgreSQL schema (two on one SQLite file) share one clock, a
file the test rewrites (schedule_app.py). Each moves 200 times by one minute; after each move
the test waits until every process has ticked its schedules at the new time, so they all race
to start each window, then until that window's runs have ended. Then the side-effect log of
the runs' step (one line per execution, not per run id) must hold each of the 200 windows of
both schedules, an `every="1m"` one and a `cron="* * * * *"` one in Europe/Berlin across the
spring DST change, exactly once.

The clock moves only once the window's runs have ended: leases are measured on the same
clock, so a minute's jump under a live run would hand it to another engine, which real time
never does within one turn.

Each process reads the clock once per poll, so right after a move they disagree by a minute
until the last one has read it, and one of them (engine-0) reads it only every few polls to
make that lag routine. The process still on the old minute may pick up a run that one on the
new minute has just started for the new window, and it leases it on the old minute. A lease
shorter than the minute would look lapsed to the others at once and the run would execute
twice: a step of clock disagreement larger than `lease_ms`, which durably does not survive
(its processes' clocks must agree well within a lease). So the leases last three minutes of
this clock: they outlast the lag of one move, and the race of the processes' claims, not
the clock harness, decides who executes a run.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from durably import Engine, RunQuery
from tests.engine_support import wait_until
from tests.faults.kill_support import kill
from tests.pg_support import fresh_schema, require_pg, schema_url

APP = Path(__file__).with_name("schedule_app.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")
MIN = 60_000
WINDOWS = 200
SCHEDULES = ("every-minute", "cron-minute")
# 20 s into a minute (ticks land inside windows, not on their edges), 40 minutes before the
# Berlin clocks jump from 02:00 to 03:00 (01:00 UTC on 29 March 2026): a cron of every minute
# still fires at every UTC minute across it.
START = int(datetime(2026, 3, 29, 0, 20, 20, tzinfo=UTC).timestamp() * 1000)
FIRST_WINDOW = START - START % MIN
# Leases on the shared clock: longer than one move of it (see the module docstring).
LEASE_MS = 3 * MIN
# engine-0 reads the clock at the end of every 4th poll only (the others at every poll).
LAGGING = {"engine-0": 4}


class Racer:
    """One schedule_app.py process."""

    def __init__(self, url: str, folder: Path, name: str) -> None:
        self.name = name
        self.ticks = folder / f"ticks-{name}"
        self.err = folder / f"{name}.err"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])),
            "SCHED_RACE_LEASE_MS": str(LEASE_MS),
            "SCHED_RACE_LAG_POLLS": str(LAGGING.get(name, 1)),
        }
        with self.err.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(APP), url, str(folder), name],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
                text=True,
            )

    def ticked(self, *, running: bool = True) -> list[int]:
        if running:
            self.check_alive()
        if not self.ticks.exists():
            return []
        return [int(line) for line in self.ticks.read_text().split()]

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{self.name} exited ({self.proc.returncode}): {self.err.read_text()[-2000:]}"
            )

    def stop(self) -> None:
        """SIGTERM: the process closes its engine (a drain) and exits 0."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=30) == 0, self.err.read_text()[-2000:]


@contextmanager
def racers(url: str, folder: Path, count: int) -> Iterator[list[Racer]]:
    started = [Racer(url, folder, f"engine-{i}") for i in range(count)]
    try:
        yield started
    finally:
        for racer in started:
            kill(racer.proc)


def set_clock(folder: Path, now: int) -> None:
    # Written whole, then renamed over the old file, so a process never reads half a number.
    tmp = folder / "clock.tmp"
    tmp.write_text(str(now))
    tmp.replace(folder / "clock")


@asynccontextmanager
async def store(kind: str, tmp_path: Path) -> AsyncIterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'race.db'}"
        return
    await require_pg()
    async with fresh_schema(create=False) as schema:
        yield schema_url(schema)


def read_effects(path: Path) -> dict[str, list[str]]:
    """Each run id's executions: `<pid> <engine> <its clock>` for each."""
    text = path.read_text() if path.exists() else ""
    executions: dict[str, list[str]] = collections.defaultdict(list)
    for line in text.splitlines():
        run_id, _, detail = line.partition(" ")
        executions[run_id].append(detail)
    return executions


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("kind", "engines"), [("postgres", 3), ("sqlite", 2)])
async def test_racing_engines_fire_every_window_exactly_once(
    kind: str, engines: int, tmp_path: Path
) -> None:
    began = time.monotonic()
    expected = {
        f"sched:{sid}:{FIRST_WINDOW + i * MIN}" for sid in SCHEDULES for i in range(WINDOWS)
    }
    set_clock(tmp_path, START)
    async with store(kind, tmp_path) as url:
        # An engine that never fires (drive=False) reads the runs; opening it first creates
        # the store's tables, so the racers do not also race the schema's creation.
        async with Engine(url, drive=False) as api:
            with racers(url, tmp_path, engines) as procs:

                async def ticked_at(now: int) -> bool:
                    return all(p.ticked()[-1:] == [now] for p in procs)

                async def window_ended(window: int) -> bool:
                    for sid in SCHEDULES:
                        run = await api.store.get_run(f"sched:{sid}:{window}")
                        if run is None or not run.is_terminal:
                            return False
                    return True

                for i in range(WINDOWS):
                    now = START + i * MIN
                    set_clock(tmp_path, now)
                    # the first wait also covers the processes' start-up
                    await wait_until(lambda t=now: ticked_at(t), timeout=60 if i == 0 else 10)
                    await wait_until(lambda w=now - now % MIN: window_ended(w))
                for p in procs:
                    p.stop()
            runs = await api.store.list_runs(RunQuery(workflow="race.wf"))
            statuses = collections.Counter(r.status for r in runs)
        ticks = {p.name: p.ticked(running=False) for p in procs}

    effects = read_effects(tmp_path / "effects.log")
    executed_twice = {run_id: seen for run_id, seen in sorted(effects.items()) if len(seen) > 1}
    assert not executed_twice, (
        f"windows executed more than once: {list(executed_twice.items())[:10]}"
    )
    missing = sorted(expected - set(effects))
    assert not missing, f"windows never executed: {missing[:10]}"
    assert set(effects) == expected  # no window outside the 200 of each schedule
    assert {r.id for r in runs} == expected and len(runs) == len(expected)
    assert statuses == {"completed": len(expected)}
    # every process ticked at every clock value, so each window was raced by all of them
    every_value = [START + i * MIN for i in range(WINDOWS)]
    for name, values in ticks.items():
        assert values == every_value, f"{name} did not tick at every clock value"
    print(
        f"{kind}: {engines} engines x {WINDOWS} windows x {len(SCHEDULES)} schedules in "
        f"{time.monotonic() - began:.1f}s"
    )
