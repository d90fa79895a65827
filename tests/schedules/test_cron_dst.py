"""Cron schedules fired by an engine across both DST changes of 2026 in Europe/Berlin and
America/New_York: the run ids started while the engine's clock walks through each change
carry exactly the UTC instants of a table written out by hand.

How the table was derived (from the zones' rules, not from the code under test):

- Berlin is UTC+1 (CET) in winter and UTC+2 (CEST) in summer, changing at 01:00 UTC on the
  last Sunday of March and of October: 29 March 2026 (local 02:00 -> 03:00, so 02:00-02:59
  does not exist) and 25 October 2026 (local 03:00 -> 02:00, so 02:00-02:59 happens twice:
  first as CEST at 00:xx UTC, then as CET at 01:xx UTC).
- New York is UTC-5 (EST) in winter and UTC-4 (EDT) in summer, changing at 02:00 local on
  the second Sunday of March and the first Sunday of November: 8 March 2026 at 07:00 UTC
  (02:00-02:59 does not exist) and 1 November 2026 at 06:00 UTC (01:00-01:59 happens twice:
  first as EDT at 05:xx UTC, then as EST at 06:xx UTC).

A local time that does not exist is skipped (never moved to 03:00); one that happens twice
fires once, at its first occurrence, so an hourly cron has no fire in the second pass of the
repeated hour.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

import durably
from durably import Engine, RunQuery

HOUR = 3_600_000
STEP = 30 * 60_000  # the clock's walk: every 30 minutes, 10 minutes past the half hour


def utc(mo: int, d: int, h: int, mi: int = 0) -> int:
    return int(datetime(2026, mo, d, h, mi, tzinfo=UTC).timestamp() * 1000)


def hours(first: int, last: int, *, but: tuple[int, ...] = ()) -> list[int]:
    """Every whole UTC hour from `first` to `last` (inclusive), except `but`."""
    return [t for t in range(first, last + 1, HOUR) if t not in but]


@durably.workflow(name="sched_dst")
async def dst_wf(ctx: durably.WorkflowCtx, data: object) -> object:
    return data


# (zone, walk from, walk to (UTC; local 20:00 the evening before the change to local 06:00
# the morning after), {cron: the fires expected, UTC}). The first fire of each cron is the
# window the walk starts in (its latest fire before the walk).
CASES = {
    "berlin-spring": (
        "Europe/Berlin",
        utc(3, 28, 19),  # 20:00 CET
        utc(3, 30, 4),  # 06:00 CEST
        {
            # 02:30 CET = 01:30 UTC on 28 Mar; 29 Mar has no 02:30; 02:30 CEST = 00:30 UTC
            "30 2 * * *": [utc(3, 28, 1, 30), utc(3, 30, 0, 30)],
            # every UTC hour: local 01:00 CET (00 UTC) is followed by 03:00 CEST (01 UTC)
            "0 * * * *": hours(utc(3, 28, 19), utc(3, 30, 4)),
        },
    ),
    "berlin-autumn": (
        "Europe/Berlin",
        utc(10, 24, 18),  # 20:00 CEST
        utc(10, 26, 5),  # 06:00 CET
        {
            # 02:30 CEST = 00:30 UTC on 24 and (first occurrence) 25 Oct, not 01:30 UTC
            # (the second); 02:30 CET = 01:30 UTC on 26 Oct
            "30 2 * * *": [utc(10, 24, 0, 30), utc(10, 25, 0, 30), utc(10, 26, 1, 30)],
            # local 02:00 happens at 00:00 UTC (fired) and 01:00 UTC (not fired)
            "0 * * * *": hours(utc(10, 24, 18), utc(10, 26, 5), but=(utc(10, 25, 1),)),
        },
    ),
    "new-york-spring": (
        "America/New_York",
        utc(3, 8, 1),  # 20:00 EST on 7 Mar
        utc(3, 9, 10),  # 06:00 EDT
        {
            # 01:30 EST = 06:30 UTC (7 and 8 Mar, before the change); 01:30 EDT = 05:30 UTC
            "30 1 * * *": [utc(3, 7, 6, 30), utc(3, 8, 6, 30), utc(3, 9, 5, 30)],
            # 02:30 EST = 07:30 UTC on 7 Mar; 8 Mar has no 02:30; 02:30 EDT = 06:30 UTC
            "30 2 * * *": [utc(3, 7, 7, 30), utc(3, 9, 6, 30)],
            # every UTC hour: 01:00 EST (06 UTC) is followed by 03:00 EDT (07 UTC)
            "0 * * * *": hours(utc(3, 8, 1), utc(3, 9, 10)),
        },
    ),
    "new-york-autumn": (
        "America/New_York",
        utc(11, 1, 0),  # 20:00 EDT on 31 Oct
        utc(11, 2, 11),  # 06:00 EST
        {
            # 01:30 EDT = 05:30 UTC on 31 Oct and (first occurrence) 1 Nov, not 06:30 UTC
            # (the second, EST); 01:30 EST = 06:30 UTC on 2 Nov
            "30 1 * * *": [utc(10, 31, 5, 30), utc(11, 1, 5, 30), utc(11, 2, 6, 30)],
            # 02:30 happens once on 1 Nov, as EST: 07:30 UTC
            "30 2 * * *": [utc(10, 31, 6, 30), utc(11, 1, 7, 30), utc(11, 2, 7, 30)],
            # local 01:00 happens at 05:00 UTC (fired) and 06:00 UTC (not fired)
            "0 * * * *": hours(utc(11, 1, 0), utc(11, 2, 11), but=(utc(11, 1, 6),)),
        },
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_cron_fires_at_the_hand_computed_instants_across_dst(
    case: str, tmp_path: Path
) -> None:
    zone, first, last, expected = CASES[case]
    ids = {cron: f"c{i}" for i, cron in enumerate(expected)}
    schedules = [
        durably.Schedule(sid, dst_wf, cron=cron, timezone=zone) for cron, sid in ids.items()
    ]
    now = [first + 10 * 60_000]
    # Its own timer poll fires only once, at open, on the walk's first instant: the walk's
    # ticks are the test's.
    async with Engine(
        f"sqlite:///{tmp_path / 'dst.db'}",
        workflows=[dst_wf],
        schedules=schedules,
        clock=lambda: now[0],
        timer_poll_ms=600_000,
    ) as eng:
        while now[0] <= last + 10 * 60_000:
            fired = await eng.fire_schedules()
            assert len(fired) == len(schedules)  # the current window of each, no catch-up
            now[0] += STEP
        runs = await eng.store.list_runs(RunQuery(workflow="sched_dst"))
    got: dict[str, list[int]] = {cron: [] for cron in expected}
    by_id = {sid: cron for cron, sid in ids.items()}
    for run in runs:
        _, sid, window = run.id.split(":")
        got[by_id[sid]].append(int(window))
    assert {cron: sorted(at) for cron, at in got.items()} == expected
