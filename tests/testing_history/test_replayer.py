"""`durably.testing.Replayer`: a ten-step run recorded on a real SQLite file and exported
replays green against the same code, fails with `NonDeterminismError` when a step is
inserted without `ctx.patched` or appended after the recorded end, and is green with
`ctx.patched`; no step body runs during any replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import durably
from durably.testing import Replayer, history_files, load_history, replay_histories
from tests.engine_support import wait_status
from tests.testing_history.orders import STEPS, Orders, orders


async def record(tmp_path: Path, code: Orders, run_id: str = "order-1") -> dict[str, Any]:
    """Run `code` to completion on an SQLite file and export its history."""
    async with durably.Engine(f"sqlite:///{tmp_path / 'rec.db'}", workflows=[code.workflow]) as e:
        await e.start(code.workflow, STEPS, run_id=run_id)
        run = await e.wait_for_run(run_id, timeout=30, until="terminal")
        assert run.status == "completed"
        return await e.export_history(run_id)


async def test_the_same_code_replays_green_without_running_a_step(tmp_path: Path) -> None:
    recorded = orders()
    history = await record(tmp_path, recorded)
    assert len(history["checkpoints"]) == STEPS
    same = orders(recorded.name)
    result = await Replayer(workflows=[same.workflow], steps=same.steps).replay(history)
    assert result.status == "completed" and result.output == sum(i * 10 for i in range(STEPS))
    assert result.recorded_status == "completed" and result.next_step is None
    assert same.calls == []


async def test_a_step_inserted_without_patched_is_non_determinism(tmp_path: Path) -> None:
    recorded = orders()
    history = await record(tmp_path, recorded)
    changed = orders(recorded.name, insert_at=4)
    with pytest.raises(durably.NonDeterminismError) as err:
        await Replayer(workflows=[changed.workflow]).replay(history)
    assert err.value.seq == 4
    assert err.value.expected == f"{recorded.name}.audit"
    assert err.value.recorded == f"{recorded.name}.work"
    assert changed.calls == []


async def test_the_same_insertion_behind_patched_replays_green(tmp_path: Path) -> None:
    recorded = orders()
    history = await record(tmp_path, recorded)
    guarded = orders(recorded.name, insert_at=4, patched=True)
    result = await Replayer(workflows=[guarded.workflow]).replay(history)
    assert result.status == "completed"
    assert guarded.calls == []


async def test_a_step_after_the_recorded_end_is_non_determinism(tmp_path: Path) -> None:
    recorded = orders()
    history = await record(tmp_path, recorded)
    appended = orders(recorded.name, append=True)
    with pytest.raises(durably.NonDeterminismError) as err:
        await Replayer(workflows=[appended.workflow]).replay(history)
    assert err.value.seq == STEPS and err.value.expected == f"{recorded.name}.audit"
    assert "end of the history" in err.value.recorded and "completed" in err.value.recorded
    assert appended.calls == []  # held before its body could run


async def test_a_live_history_stops_at_its_frontier(tmp_path: Path) -> None:
    """A run recorded while waiting for a signal replays to that wait (green), and code
    with a new step past the recorded end stops there: that is the run's future."""
    recorded = orders(wait_signal=True)
    async with durably.Engine(
        f"sqlite:///{tmp_path / 'live.db'}", workflows=[recorded.workflow]
    ) as engine:
        await engine.start(recorded.workflow, STEPS, run_id="live")
        await wait_status(engine, "live", "suspended")
        history = await engine.export_history("live")
    same = orders(recorded.name, wait_signal=True)
    result = await Replayer(workflows=[same.workflow]).replay(history)
    assert result.recorded_status == "suspended" and result.status == "suspended"
    # A history cut before its wait: the code's wait is past the frontier, which is fine.
    cut = {**history, "checkpoints": history["checkpoints"][:5]}
    cut["run"] = {**history["run"], "status": "suspended"}
    appended = orders(recorded.name, append=True)
    stopped = await Replayer(workflows=[appended.workflow]).replay(cut)
    assert stopped.status == "stopped" and stopped.next_step == f"{recorded.name}.work"
    assert same.calls == [] and appended.calls == []


async def test_a_different_ending_is_non_determinism(tmp_path: Path) -> None:
    recorded = orders()
    history = await record(tmp_path, recorded)
    edited = json.loads(json.dumps(history))
    edited["run"]["output"] = 1  # the recorded run "returned" something else
    with pytest.raises(durably.NonDeterminismError) as err:
        await Replayer(workflows=[orders(recorded.name).workflow]).replay(edited)
    assert "output 1" in err.value.recorded


async def test_a_workflow_the_replayer_lacks_is_refused(tmp_path: Path) -> None:
    recorded = orders()
    history = await record(tmp_path, recorded)
    with pytest.raises(ValueError, match="not among the Replayer's workflows"):
        await Replayer(workflows=[orders().workflow]).replay(history)
    wrong_version = {**history, "run": {**history["run"], "workflowVersion": "7"}}
    with pytest.raises(ValueError, match="version '7'"):
        await Replayer(workflows=[orders(recorded.name).workflow]).replay(wrong_version)
    with pytest.raises(ValueError, match="give the workflows"):
        Replayer(workflows=[])


def test_replay_histories_names_each_file_that_fails(tmp_path: Path) -> None:
    import asyncio

    recorded = orders()
    history = asyncio.run(record(tmp_path, recorded))
    folder = tmp_path / "histories"
    folder.mkdir()
    (folder / "a-good.json").write_text(json.dumps(history))
    (folder / "b-good.json").write_text(json.dumps(history))
    results = replay_histories(folder, workflows=[orders(recorded.name).workflow])
    assert [r.status for r in results] == ["completed", "completed"]
    assert [p.name for p in history_files(folder)] == ["a-good.json", "b-good.json"]
    (folder / "c-bad.json").write_text('{"format": "other"}')
    changed = orders(recorded.name, insert_at=2)
    with pytest.raises(AssertionError) as err:
        replay_histories(folder, workflows=[changed.workflow])
    message = str(err.value)
    assert "3 of 3 histories" in message
    assert "a-good.json: NonDeterminismError" in message
    assert "c-bad.json: HistoryFormatError" in message and "format is 'other'" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(AssertionError, match=r"no \*\.json history"):
        replay_histories(empty, workflows=[changed.workflow])


def test_replay_sync_and_a_loaded_history(tmp_path: Path) -> None:
    import asyncio

    recorded = orders()
    path = tmp_path / "h.json"
    path.write_text(json.dumps(asyncio.run(record(tmp_path, recorded))))
    loaded = load_history(path)
    same = orders(recorded.name)
    assert Replayer(workflows=[same.workflow]).replay_sync(loaded).status == "completed"
    assert Replayer(workflows=[same.workflow]).replay_sync(path).status == "completed"


async def test_a_failed_history_replays_to_the_same_failure(tmp_path: Path) -> None:
    calls: list[int] = []

    def declare(name: str) -> durably.Workflow[Any, Any]:
        @durably.step(f"{name}.charge", retries=2, backoff_ms=1)
        async def charge(i: int) -> int:
            calls.append(i)
            raise RuntimeError("card declined")

        @durably.workflow(name)
        async def wf(ctx: durably.WorkflowCtx, n: int) -> int:
            return int(await ctx.step(charge, n))

        return wf

    wf = declare("replay-failed")
    async with durably.Engine(f"sqlite:///{tmp_path / 'f.db'}", workflows=[wf]) as engine:
        await engine.start(wf, 1, run_id="declined")
        run = await engine.wait_for_run("declined", timeout=30, until="terminal")
        assert run.status == "failed"
        history = await engine.export_history("declined")
    assert history["checkpoints"][0]["attempts"] == 2
    calls.clear()
    result = await Replayer(workflows=[declare("replay-failed")]).replay(history)
    assert result.status == "failed" and calls == []


async def test_a_cancelled_history_is_checked_up_to_where_it_was_cancelled(
    tmp_path: Path,
) -> None:
    recorded = orders(wait_signal=True)
    async with durably.Engine(
        f"sqlite:///{tmp_path / 'c.db'}", workflows=[recorded.workflow]
    ) as engine:
        await engine.start(recorded.workflow, STEPS, run_id="cancelled")
        await wait_status(engine, "cancelled", "suspended")
        await engine.cancel("cancelled")
        await wait_status(engine, "cancelled", "cancelled")
        history = await engine.export_history("cancelled")
    result = await Replayer(workflows=[orders(recorded.name, wait_signal=True).workflow]).replay(
        history
    )
    assert result.recorded_status == "cancelled" and result.status == "suspended"
    with pytest.raises(durably.NonDeterminismError):
        await Replayer(
            workflows=[orders(recorded.name, insert_at=1, wait_signal=True).workflow]
        ).replay(history)


async def test_a_local_step_past_the_end_is_held_before_it_runs(tmp_path: Path) -> None:
    ran: list[str] = []

    def declare(extra: bool) -> durably.Workflow[Any, Any]:
        @durably.workflow("replay-local")
        async def wf(ctx: durably.WorkflowCtx, _: None) -> str:
            first = await ctx.local_step("first", lambda log: ran.append("first") or "a")
            if extra:
                await ctx.local_step("second", lambda log: ran.append("second") or "b")
            return str(first)

        return wf

    async with durably.Engine(
        f"sqlite:///{tmp_path / 'l.db'}", workflows=[wf := declare(False)]
    ) as engine:
        await engine.start(wf, None, run_id="local")
        await engine.wait_for_run("local", timeout=30, until="terminal")
        history = await engine.export_history("local")
    ran.clear()
    assert (await Replayer(workflows=[declare(False)]).replay(history)).output == "a"
    with pytest.raises(durably.NonDeterminismError) as err:
        await Replayer(workflows=[declare(True)]).replay(history)
    assert (err.value.seq, err.value.expected) == (1, "second")
    assert ran == []
