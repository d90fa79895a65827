"""`durably runs show` labels each row by what it stands for, as the console does
(`durably._read.rows`): an in-process step is not "remote", a sleep shows how long it slept,
and the deadline the engine writes for a wait with a timeout is folded into that wait unless
`--engine-rows` (real SQLite files, the real console script)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import durably
from durably import SignalTimeoutError, WorkflowCtx
from durably._cli.render import format_duration
from tests.cli.support import durably as cli
from tests.cli.support import json_of, ok, sqlite_url
from tests.engine_support import wait_waiting_on

RUN = "tour-1"
APPROVE = "approve-bob"
NEVER = "never-bob"


@durably.step("rowcli.shout")
def shout(name: str) -> str:
    return name.upper()


@durably.workflow("rowcli.tour")
async def tour(ctx: WorkflowCtx, name: str) -> str:
    loud = await ctx.step(shout, name)
    await ctx.sleep("1s")
    got = await ctx.wait_for_signal(APPROVE, timeout="1m")
    try:
        await ctx.wait_for_signal(NEVER, timeout="50ms")
    except SignalTimeoutError:
        pass
    return f"{loud} {got}"


async def _until_waiting(store: str) -> None:
    async with durably.Engine(store=store, workflows=[tour], steps=[shout]) as engine:
        await engine.start(tour, "bob", run_id=RUN)
        await wait_waiting_on(engine, RUN, APPROVE)


async def _finish(store: str) -> None:
    async with durably.Engine(store=store, workflows=[tour], steps=[shout]) as engine:
        await engine.signal(APPROVE, "ok")
        assert await engine.get_handle(RUN).result(timeout=20) == "BOB ok"


def _show(tmp_path: Path, store: str, *flags: str) -> str:
    return ok(cli("runs", "show", RUN, "--store", store, *flags, cwd=tmp_path)).stdout


def _row(text: str, name: str) -> list[str]:
    """The cells of the timeline row naming `name` (cells are two or more spaces apart)."""
    [line] = [
        line for line in text.splitlines() if f" {name} " in line or line.endswith(f" {name}")
    ]
    return [cell.strip() for cell in line.strip().split("  ") if cell.strip()]


def _views(detail: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {cp["name"]: cp for cp in detail["timeline"]}


def test_rows_say_what_they_stand_for(tmp_path: Path) -> None:
    store = sqlite_url(tmp_path / "rows.db")
    asyncio.run(_until_waiting(store))

    # Waiting: the deadline is the only trace of the open wait, so it is shown.
    waiting = _show(tmp_path, store)
    deadline = _row(waiting, f"timeout:{APPROVE}")
    assert deadline[1:4] == [f"↳ timeout:{APPROVE}", f"timeout of signal wait {APPROVE}", "armed"]
    assert "engine row" not in waiting  # nothing folded

    asyncio.run(_finish(store))
    detail = json_of(cli("runs", "show", RUN, "--store", store, "--json", cwd=tmp_path))
    rows = _views(detail)
    text = _show(tmp_path, store)

    # The stored kind is unchanged in the JSON; the view is added under `row`.
    assert rows["rowcli.shout"]["kind"] == "remote"
    assert rows["rowcli.shout"]["row"]["kind"] == "in_process_step"
    step = _row(text, "rowcli.shout")
    assert step[2:4] == ["in-process step", "completed"]
    assert "remote" not in text

    # The sleep's duration is what the stored row says (scheduled → due), not 0 ms.
    sleep = rows["sleep"]
    assert sleep["startedAt"] == sleep["finishedAt"]  # written once, when scheduled
    slept = sleep["row"]["durationMs"]
    assert 990 <= slept <= 1000, sleep
    cells = _row(text, "sleep")
    assert cells[2:4] == ["sleep", "completed"]
    assert cells[5] == format_duration(slept) and cells[5] != "0ms"

    # The signal wait shows its timeout and how long it waited; its deadline is folded.
    wait_name = next(n for n in rows if n.endswith(APPROVE) and not n.startswith("timeout:"))
    wait = _row(text, wait_name)
    assert wait[2] == "signal wait · timeout 1.0m"
    assert wait[5] == format_duration(rows[wait_name]["row"]["durationMs"])
    assert f"timeout:{APPROVE}" not in text
    assert "(1 engine row folded into its wait; --engine-rows shows them)" in text
    # A wait that ended by its timeout has no row: its deadline stays, marked fired.
    fired = _row(text, f"timeout:{NEVER}")
    assert fired[2:4] == [f"timeout of signal wait {NEVER}", "fired"]

    # --engine-rows draws the folded deadline too, as what it is.
    everything = _show(tmp_path, store, "--engine-rows")
    shown = _row(everything, f"timeout:{APPROVE}")
    assert shown[1:4] == [
        f"↳ timeout:{APPROVE}",
        f"timeout of signal wait {APPROVE}",
        "not reached",
    ]
    assert "folded" not in everything

    # The JSON has every row whatever the flag, the engine's marked as such.
    assert rows[f"timeout:{APPROVE}"]["kind"] == "sleep"
    assert rows[f"timeout:{APPROVE}"]["row"]["engine"] is True
    assert len(detail["timeline"]) == 5
