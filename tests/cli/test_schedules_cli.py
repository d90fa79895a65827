"""`durably schedules list|describe|pause|unpause|trigger|delete|backfill` (the real console
script in subprocesses, SQLite files in tmp_path): persisted schedules by --store, static ones
too with --app, and the refusals."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

import durably
from durably._cli.common import CliError
from durably._cli.schedules import parse_when
from tests.cli.support import durably as cli
from tests.cli.support import json_of, ok, sqlite_url

MIN = 60_000
T = 1_000 * MIN

APP = """
import durably

@durably.workflow(name="cli_sched_tick")
async def tick(ctx: durably.WorkflowCtx, data: dict) -> dict:
    return data

engine = durably.Engine(
    STORE_URL,
    workflows=[tick],
    schedules=[durably.Schedule("declared", tick, {}, every="1h")],
)
"""


@durably.workflow(name="cli_sched_tick")
async def tick(ctx: durably.WorkflowCtx, data: dict) -> dict:
    return data


def _create(url: str, *schedules: durably.Schedule) -> None:
    async def go() -> None:
        async with durably.Engine(url, workflows=[tick], drive=False) as engine:
            for schedule in schedules:
                await engine.schedules.create(schedule)

    asyncio.run(go())


def _write_app(tmp_path: Path, url: str) -> None:
    (tmp_path / "schedapp.py").write_text(
        textwrap.dedent(APP.replace("STORE_URL", repr(url))), encoding="utf-8"
    )


def test_list_describe_pause_unpause_and_delete(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    _create(url, durably.Schedule("rep", tick, {"n": 1}, every="5m", tags=("nightly",)))

    listed = json_of(cli("schedules", "list", "--store", url, "--json", cwd=tmp_path))
    [only] = listed["schedules"]
    assert only["schedule"]["id"] == "rep" and only["source"] == "persisted"
    assert only["schedule"]["everyMs"] == 5 * MIN and only["schedule"]["tags"] == ["nightly"]
    assert len(only["nextFires"]) == 5
    human = ok(cli("schedules", "list", "--store", url, cwd=tmp_path)).stdout
    assert "rep" in human and "every 300000 ms" in human and "active" in human

    paused = json_of(
        cli(
            "schedules", "pause", "rep", "--note", "db move", "--store", url, "--json", cwd=tmp_path
        )
    )
    assert paused["schedule"]["paused"] is True and paused["note"] == "db move"
    assert paused["nextFires"] == []
    assert [
        s["schedule"]["id"]
        for s in json_of(
            cli("schedules", "list", "--paused", "--store", url, "--json", cwd=tmp_path)
        )["schedules"]
    ] == ["rep"]
    shown = ok(cli("schedules", "describe", "rep", "--store", url, cwd=tmp_path)).stdout
    assert "paused — db move" in shown and "workflow cli_sched_tick" in shown
    assert "unpaused" in ok(cli("schedules", "unpause", "rep", "--store", url, cwd=tmp_path)).stdout

    kept = cli("schedules", "delete", "rep", "--store", url, cwd=tmp_path, stdin="n\n")
    assert kept.returncode == 1 and "kept" in kept.stderr
    assert (
        "deleted"
        in ok(cli("schedules", "delete", "rep", "--yes", "--store", url, cwd=tmp_path)).stdout
    )
    gone = cli("schedules", "describe", "rep", "--store", url, cwd=tmp_path)
    assert gone.returncode == 1 and 'no schedule "rep"' in gone.stderr
    assert "No schedules." in ok(cli("schedules", "list", "--store", url, cwd=tmp_path)).stdout


def test_trigger_and_backfill_start_runs(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    _create(url, durably.Schedule("rep", tick, {}, every="1m", paused=True))
    started = json_of(cli("schedules", "trigger", "rep", "--store", url, "--json", cwd=tmp_path))
    assert started["runId"].startswith("sched:rep:manual:")
    filled = json_of(
        cli(
            "schedules",
            "backfill",
            "rep",
            "--start",
            "1970-01-01T16:37:00Z",  # T - 3 minutes
            "--end",
            str(T),
            "--store",
            url,
            "--json",
            cwd=tmp_path,
        )
    )
    assert filled["runIds"] == [f"sched:rep:{T - i * MIN}" for i in (3, 2, 1)]
    described = json_of(cli("schedules", "describe", "rep", "--store", url, "--json", cwd=tmp_path))
    assert [r["runId"] for r in described["recentRuns"]][:3] == filled["runIds"][::-1]
    naive = cli(
        "schedules",
        "backfill",
        "rep",
        "--start",
        "2026-01-01T00:00",
        "--end",
        str(T),
        "--store",
        url,
        cwd=tmp_path,
    )
    assert naive.returncode == 2 and "no UTC offset" in naive.stderr
    wide = cli(
        "schedules",
        "backfill",
        "rep",
        "--start",
        "0",
        "--end",
        str(T * 100),
        "--store",
        url,
        cwd=tmp_path,
    )
    assert wide.returncode == 1 and "more than 10000 windows" in wide.stderr


def test_an_app_shows_its_static_schedules_and_refuses_to_pause_them(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    _write_app(tmp_path, url)
    _create(url, durably.Schedule("rep", tick, {}, every="1m"))
    listed = json_of(cli("schedules", "list", "--app", "schedapp:engine", "--json", cwd=tmp_path))
    assert [(s["schedule"]["id"], s["source"]) for s in listed["schedules"]] == [
        ("declared", "static"),
        ("rep", "persisted"),
    ]
    refused = cli("schedules", "pause", "declared", "--app", "schedapp:engine", cwd=tmp_path)
    assert refused.returncode == 1 and "declared in code" in refused.stderr
    # Without the app the store knows only the persisted one.
    missing = cli("schedules", "describe", "declared", "--store", url, cwd=tmp_path)
    assert missing.returncode == 1 and 'no schedule "declared"' in missing.stderr


def test_when_is_epoch_ms_or_an_aware_iso_time() -> None:
    assert parse_when("60000", "--start") == 60_000
    assert parse_when("1970-01-01T00:01:00Z", "--start") == 60_000
    assert parse_when("1970-01-01T01:01:00+01:00", "--start") == 60_000
    with pytest.raises(CliError, match="expected an ISO 8601 time"):
        parse_when("yesterday", "--end")
