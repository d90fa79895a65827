"""Cron schedules: fire times in a zone with DST (a table of UTC instants computed by hand),
clear errors for bad declarations, and the firing of cron windows on a real SQLite file."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

import durably
from durably import Engine, RunQuery
from durably._engine.defs.schedules import next_cron_fire_ms, prev_cron_fire_ms


def ms(y: int, mo: int, d: int, h: int, mi: int = 0) -> int:
    return int(datetime(y, mo, d, h, mi, tzinfo=UTC).timestamp() * 1000)


# (expr, zone, now (UTC), next fire strictly after now (UTC)) — by hand: Berlin is UTC+1 in
# winter, UTC+2 in summer, switching at 01:00 UTC on the last Sunday of March (30 Mar 2025)
# and of October (26 Oct 2025); New York is UTC-5 / UTC-4, switching at 2:00 local on the
# second Sunday of March (9 Mar 2025) and the first Sunday of November (2 Nov 2025).
NEXT_TABLE = [
    # 02:30 Berlin does not exist on 30 Mar: skipped, next is 31 Mar 02:30 CEST = 00:30 UTC
    ("30 2 * * *", "Europe/Berlin", ms(2025, 3, 29, 2), ms(2025, 3, 31, 0, 30)),
    # the day before the change it fires at 02:30 CET = 01:30 UTC
    ("30 2 * * *", "Europe/Berlin", ms(2025, 3, 28, 2), ms(2025, 3, 29, 1, 30)),
    # 02:30 Berlin happens twice on 26 Oct: fires once, at the first (CEST) = 00:30 UTC
    ("30 2 * * *", "Europe/Berlin", ms(2025, 10, 25, 23), ms(2025, 10, 26, 0, 30)),
    ("30 2 * * *", "Europe/Berlin", ms(2025, 10, 26, 0, 30), ms(2025, 10, 27, 1, 30)),
    # 02:30 New York does not exist on 9 Mar: skipped; 10 Mar 02:30 EDT = 06:30 UTC
    ("30 2 * * *", "America/New_York", ms(2025, 3, 9, 0), ms(2025, 3, 10, 6, 30)),
    # 01:30 New York happens twice on 2 Nov: once, at the first (EDT) = 05:30 UTC
    ("30 1 * * *", "America/New_York", ms(2025, 11, 2, 0), ms(2025, 11, 2, 5, 30)),
    ("30 1 * * *", "America/New_York", ms(2025, 11, 2, 5, 30), ms(2025, 11, 3, 6, 30)),
    # 9:00 New York, every weekday: EST then EDT around the March change
    ("0 9 * * 1-5", "America/New_York", ms(2025, 3, 7, 15), ms(2025, 3, 10, 13)),
    ("0 9 * * 1-5", "America/New_York", ms(2025, 3, 6, 15), ms(2025, 3, 7, 14)),
    # six fields: leading seconds
    ("15 0 12 * * *", "UTC", ms(2025, 1, 1, 0), ms(2025, 1, 1, 12) + 15_000),
]


@pytest.mark.parametrize(("expr", "zone", "now", "expected"), NEXT_TABLE)
def test_next_fire_across_dst(expr: str, zone: str, now: int, expected: int) -> None:
    assert next_cron_fire_ms(expr, now, zone) == expected
    # and the previous fire at that instant is the instant itself
    assert prev_cron_fire_ms(expr, expected, zone) == expected


def test_repeated_hour_fires_once_per_window() -> None:
    # Every 30 minutes in Berlin over the autumn change (00:00-02:00 UTC on 26 Oct 2025):
    # local 02:00 and 02:30 happen twice but each wall time is one window.
    fires = []
    t = ms(2025, 10, 25, 23, 59)
    while t < ms(2025, 10, 26, 2):
        t = next_cron_fire_ms("*/30 * * * *", t, "Europe/Berlin")  # type: ignore[assignment]
        fires.append(t)
    assert len(fires) == len(set(fires))
    assert ms(2025, 10, 26, 0) in fires and ms(2025, 10, 26, 0, 30) in fires
    assert ms(2025, 10, 26, 2) in fires


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "* * *"}, "invalid cron expression"),
        ({"cron": "0 * * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
    ],
)
def test_bad_cron_is_a_clear_error(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        durably.Schedule("c", "sched_cron", **kwargs)  # type: ignore[arg-type]


@durably.workflow(name="sched_cron")
async def cron_wf(ctx: durably.WorkflowCtx, data: object) -> object:
    return data


async def test_cron_windows_fire_once_with_catchup(tmp_path: Path) -> None:
    now = [ms(2025, 3, 30, 0, 10)]
    sched = [
        durably.Schedule(
            "berlin", cron_wf, cron="30 * * * *", timezone="Europe/Berlin", max_catchup=2
        )
    ]
    url = f"sqlite:///{tmp_path / 'cron.db'}"
    async with (
        Engine(url, workflows=[cron_wf], schedules=sched, clock=lambda: now[0]) as a,
        Engine(url, workflows=[cron_wf], schedules=sched, clock=lambda: now[0]) as b,
    ):
        assert await a.fire_schedules() == [
            f"sched:berlin:{ms(2025, 3, 29, 21, 30)}",
            f"sched:berlin:{ms(2025, 3, 29, 22, 30)}",
            f"sched:berlin:{ms(2025, 3, 29, 23, 30)}",
        ]
        await b.fire_schedules()
        now[0] = ms(2025, 3, 30, 1, 45)  # across the spring change: 00:30 and 01:30 UTC
        await b.fire_schedules()
        await a.fire_schedules()
        runs = await a.store.list_runs(RunQuery(workflow="sched_cron"))
        starts = sorted(int(r.id.rsplit(":", 1)[1]) for r in runs)
        assert starts == [
            ms(2025, 3, 29, 21, 30),
            ms(2025, 3, 29, 22, 30),
            ms(2025, 3, 29, 23, 30),
            ms(2025, 3, 30, 0, 30),
            ms(2025, 3, 30, 1, 30),
        ]


def test_missing_croniter_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "croniter", None)  # makes `import croniter` fail
    with pytest.raises(ImportError, match=r"install 'durably\[cron\]'"):
        durably.Schedule("c", "sched_cron", cron="0 * * * *")
