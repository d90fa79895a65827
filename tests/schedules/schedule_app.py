"""One engine process of the racing-schedules tests (run by test_schedule_race.py as
`python schedule_app.py STORE_URL DIR NAME`).

It opens a driving engine on STORE_URL with two schedules of `race.wf`, one `every="1m"` and
one `cron="* * * * *"` (in Europe/Berlin), and drives runs until SIGTERM, which it handles by
closing the engine (a drain), then exiting 0.

The engine's clock is the epoch-ms number in DIR/clock, read once per timer poll: the clock
callable returns a cached value that only the last pass of a poll replaces. Before replacing
it, that pass appends the value the poll ran with to DIR/ticks-NAME (once per value), so a line
`T` there means this engine's schedules were ticked at clock T (the schedule pass belongs to
the same poll, or to the one before when it runs after ours). The test moves the clock by
rewriting DIR/clock and knows every process has ticked at the new time when each ticks file
ends with it.

The clock file is read at the end of every poll, or of every Nth one with
SCHED_RACE_LAG_POLLS=N: that process then lags the others by up to N polls after each move,
still timing its leases on the old value while the others already start the new window's
runs.

Leases last SCHED_RACE_LEASE_MS on that clock (the test sets it). Clocks that disagree by more
than a lease make every lease look lapsed to the process ahead, which then takes runs the
others still execute: durably requires its processes' clocks to agree well within `lease_ms`,
so the lease must outlast the lag of one move.

Side-effect log: the one step of `race.wf` appends `<run id> <pid> <name> <clock>` to
DIR/effects.log with a single O_APPEND write, so lines of racing processes never tear; it
counts executions, not run ids (the name and the clock value say who executed it and when).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import durably
from durably import WorkflowCtx

TIMER_POLL_MS = int(os.environ.get("SCHED_RACE_POLL_MS", "25"))
LAG_POLLS = int(os.environ.get("SCHED_RACE_LAG_POLLS", "1"))
LEASE_MS = int(os.environ.get("SCHED_RACE_LEASE_MS", "180000"))  # three minutes
EFFECTS = "effects.log"


def schedules() -> list[durably.Schedule]:
    return [
        durably.Schedule("every-minute", "race.wf", every="1m"),
        durably.Schedule("cron-minute", "race.wf", cron="* * * * *", timezone="Europe/Berlin"),
    ]


def append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


class FileClock:
    """The engine's clock: the value of DIR/clock as of this engine's last timer poll."""

    def __init__(self, source: Path, ticks: Path, *, lag_polls: int = 1) -> None:
        self._source = source
        self._ticks = ticks
        self._lag_polls = lag_polls
        self.now = self._read()
        self._recorded: int | None = None
        self._polled = False
        self._polls = 0

    def _read(self) -> int:
        return int(self._source.read_text())

    def __call__(self) -> int:
        return self.now

    async def end_of_poll(self) -> None:
        # The first pass may run before this poll's schedule pass: a value is recorded only
        # once a whole poll has run with it.
        if self._polled and self.now != self._recorded:
            append(self._ticks, str(self.now))
            self._recorded = self.now
        self._polled = True
        self._polls += 1
        if self._polls % self._lag_polls == 0:
            self.now = self._read()


async def main() -> None:
    url, folder, name = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    effects = folder / EFFECTS

    @durably.step("race.record")
    def record(run_id: str) -> str:
        append(effects, f"{run_id} {os.getpid()} {name} {clock.now}")
        return run_id

    @durably.workflow("race.wf")
    async def race_wf(ctx: WorkflowCtx, data: object) -> str:
        return await ctx.step(record, ctx.run_id)

    clock = FileClock(folder / "clock", folder / f"ticks-{name}", lag_polls=LAG_POLLS)
    engine = durably.Engine(
        url,
        workflows=[race_wf],
        steps=[record],
        schedules=schedules(),
        clock=clock,
        instance_id=name,
        timer_poll_ms=TIMER_POLL_MS,
        lease_ms=LEASE_MS,
        drain_timeout_ms=5000,
    )
    # After the engine's own passes (the schedules' among them): the end of every poll. The
    # engine has no public hook at the end of a poll pass, hence its poller's own.
    engine._worker.poller.add_pass(clock.end_of_poll)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with engine:
        print(f"READY {os.getpid()}", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
