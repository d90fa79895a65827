"""`durably runs show` lists every failed attempt of a retried step (text), and `--json`
carries them as each step's `attemptErrors`."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import durably
from durably import RetryPolicy, StepError, WorkflowCtx
from durably._cli.render import attempt_lines
from durably._core.models import ATTEMPT_ERRORS_FIRST, ATTEMPT_ERRORS_LAST, StepCheckpoint
from tests.cli.support import durably as cli
from tests.cli.support import json_of, ok

_calls: list[int] = []


class Transient(Exception):
    pass


@durably.step("cliattempts.flaky", retry=RetryPolicy(max_attempts=3))
def flaky(x: int) -> int:
    _calls.append(x)
    if len(_calls) < 3:
        raise Transient(f"down #{len(_calls)}")
    return x


@durably.workflow("cliattempts.wf")
async def wf(ctx: WorkflowCtx, x: int) -> int:
    return await ctx.step(flaky, x)


async def _make_run(store: str) -> None:
    async with durably.Engine(store=store, workflows=[wf], steps=[flaky]) as engine:
        assert await engine.execute(wf, 5, run_id="retried", timeout=30) == 5


def test_runs_show_lists_the_attempts_of_a_retried_step(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'attempts.db'}"
    asyncio.run(_make_run(store))

    human = ok(cli("runs", "show", "retried", "--store", store, cwd=tmp_path)).stdout
    lines = human.splitlines()
    assert "attempts:" in lines, human
    block = lines[lines.index("attempts:") + 1 :]
    assert "seq 0  cliattempts.flaky  [completed]  3 attempts, 2 failed" in block[0]
    assert block[1].strip().startswith("#1 ") and block[1].endswith("down #1")
    assert block[2].strip().startswith("#2 ") and block[2].endswith("down #2")

    detail = json_of(cli("runs", "show", "retried", "--store", store, "--json", cwd=tmp_path))
    [step] = detail["timeline"]
    assert [(e["attempt"], e["message"]) for e in step["attemptErrors"]] == [
        (1, "down #1"),
        (2, "down #2"),
    ]


def test_a_long_history_says_how_many_attempts_were_not_kept() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    cp = StepCheckpoint(
        run_id="r", seq=3, name="s", kind="remote", step_id="r:3", status="failed",
        started_at=at, finished_at=at, attempts=40,
    )  # fmt: skip
    for n in range(1, 41):
        cp = cp.with_attempt_error(n, n, StepError(message=f"m{n}", code="E" if n == 40 else None))
    lines = attempt_lines([cp])
    assert lines[:3] == ["", "attempts:", "  seq 3  s  [failed]  40 attempts, 40 failed"]
    entries = lines[3:]
    kept = ATTEMPT_ERRORS_FIRST + ATTEMPT_ERRORS_LAST
    assert len(entries) == kept + 1
    assert entries[ATTEMPT_ERRORS_FIRST] == f"    … {40 - kept} more failed, not kept"
    assert entries[-1] == "    #40  00:00:00.040  [E] m40"
    assert attempt_lines([]) == []
