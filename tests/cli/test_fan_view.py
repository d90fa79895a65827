"""`durably runs show` on a run with a wide fan: one row for the fan, members paged on
request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import durably
from durably import FatalError, WorkflowCtx
from tests.cli.support import durably as cli
from tests.cli.support import json_of, ok


@durably.step("cliview.leaf")
def leaf(i: int) -> int:
    if i % 100 == 7:
        raise FatalError(f"member {i} refused", code="REFUSED")
    return i


@durably.workflow("cliview.fan")
async def fan_wf(ctx: WorkflowCtx, n: int) -> int:
    settled = await ctx.all_settled(leaf, range(n))
    return sum(1 for s in settled if s.status == "fulfilled")


async def _make_run(store: str) -> None:
    async with durably.Engine(store=store, workflows=[fan_wf], steps=[leaf]) as engine:
        assert await engine.execute(fan_wf, 500, run_id="wide", timeout=60) == 495


def test_a_wide_fan_is_one_row_and_its_members_page(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'fan.db'}"
    asyncio.run(_make_run(store))

    human = ok(cli("runs", "show", "wide", "--store", store, cwd=tmp_path)).stdout
    lines = human.splitlines()
    fan_rows = [line for line in lines if "cliview.leaf ×500" in line]
    assert len(fan_rows) == 1, human
    assert "0-499" in fan_rows[0] and "495 completed" in fan_rows[0] and "5 failed" in fan_rows[0]
    assert "[" in fan_rows[0] and "]" in fan_rows[0]  # the progress bar
    assert len(lines) < 60, human  # a screenful, not 500 rows
    assert "member 7 refused" in human  # the first failures are listed under the fan

    detail = json_of(cli("runs", "show", "wide", "--store", store, "--json", cwd=tmp_path))
    assert detail["run"]["status"] == "completed"
    [fan] = detail["fans"]
    assert fan["size"] == 500 and fan["counts"] == {"completed": 495, "failed": 5}
    assert len(detail["timeline"]) < 10  # members are not listed
    group = fan["group"]
    # The id `--fan` takes is in the text view too, with the command that pages it.
    [id_row] = [line for line in lines if line.strip().startswith(group + " ")]
    assert "cliview.leaf, 500 members, seq 0-499" in id_row
    assert "durably runs show wide --fan FAN" in human

    failed = json_of(
        cli(
            "runs",
            "show",
            "wide",
            "--store",
            store,
            "--fan",
            group,
            "--failed",
            "--json",
            cwd=tmp_path,
        )
    )
    assert failed["total"] == 5
    assert [cp["seq"] for cp in failed["items"]] == [7, 107, 207, 307, 407]

    page = ok(
        cli(
            "runs",
            "show",
            "wide",
            "--store",
            store,
            "--fan",
            group,
            "--offset",
            "100",
            "--limit",
            "10",
            cwd=tmp_path,
        )
    ).stdout
    assert "members 101–110 of 500" in page
    assert "next page: --fan" in page and "--offset 110" in page
