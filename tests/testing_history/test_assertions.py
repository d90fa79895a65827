"""The run assertions, each passing on a real run (engine over an SQLite file, read through
the engine and through a `Client`) and failing with a message naming expected and actual."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import durably
from durably.testing import (
    assert_output,
    assert_run_status,
    assert_step_attempts,
    assert_steps_ran,
    fail_once,
    recorded_steps,
)


@durably.step("assert.add")
async def add(i: int) -> int:
    return i + 1


def declare() -> durably.Workflow[Any, Any]:
    """The workflow with a fresh `fail_once` body (each counts its own calls)."""
    flaky = durably.step("assert.flaky", retries=3, backoff_ms=1)(fail_once("fine"))

    @durably.workflow("assert-wf")
    async def wf(ctx: durably.WorkflowCtx, n: int) -> dict[str, Any]:
        first = await ctx.step(add, n)
        await ctx.patched("v2")  # a marker, not a step
        note = await ctx.step(flaky)
        stamp = await ctx.local_step("assert.local", lambda log: "local")
        await ctx.sleep(0)
        return {"first": first, "note": note, "stamp": stamp}

    return wf


@durably.workflow("assert-fails")
async def fails(ctx: durably.WorkflowCtx, _: None) -> None:
    raise durably.FatalError("nope")


@pytest.fixture
async def engine(tmp_path: Path) -> Any:
    async with durably.Engine(
        f"sqlite:///{tmp_path / 'a.db'}", workflows=[wf := declare(), fails]
    ) as engine:
        await engine.start(wf, 1, run_id="ok")
        await engine.wait_for_run("ok", timeout=30, until="terminal")
        await engine.start(fails, None, run_id="bad")
        await engine.wait_for_run("bad", timeout=30, until="terminal")
        yield engine


async def test_steps_ran(engine: durably.Engine, tmp_path: Path) -> None:
    names = ["assert.add", "assert.flaky", "assert.local"]
    assert await recorded_steps(engine, "ok") == names
    await assert_steps_ran(engine, "ok", names)
    async with durably.Client(f"sqlite:///{tmp_path / 'a.db'}") as client:
        await assert_steps_ran(client, "ok", names)
    with pytest.raises(AssertionError) as err:
        await assert_steps_ran(engine, "ok", ["assert.add", "assert.local"])
    assert str(err.value) == (
        "run 'ok': expected steps ['assert.add', 'assert.local'], but the run recorded "
        "['assert.add', 'assert.flaky', 'assert.local']"
    )
    with pytest.raises(AssertionError, match="run 'missing' not found"):
        await assert_steps_ran(engine, "missing", [])


async def test_step_attempts(engine: durably.Engine) -> None:
    await assert_step_attempts(engine, "ok", {"assert.add": 1, "assert.flaky": 2})
    with pytest.raises(AssertionError) as err:
        await assert_step_attempts(engine, "ok", {"assert.flaky": 1, "assert.gone": 1})
    assert str(err.value) == (
        "run 'ok': 'assert.flaky': expected 1 attempts, got 2; "
        "'assert.gone': expected 1 attempts, but the run has no such step"
    )


async def test_output(engine: durably.Engine) -> None:
    await assert_output(engine, "ok", {"first": 2, "note": "fine", "stamp": "local"})
    with pytest.raises(AssertionError) as err:
        await assert_output(engine, "ok", {"first": 3})
    assert "expected output {'first': 3}, got {'first': 2, " in str(err.value)
    with pytest.raises(AssertionError) as err:
        await assert_output(engine, "bad", None)
    assert str(err.value) == "run 'bad': expected output None, but the run is failed (nope)"


async def test_run_status(engine: durably.Engine) -> None:
    await assert_run_status(engine, "ok", "completed")
    await assert_run_status(engine, "bad", "failed")
    with pytest.raises(AssertionError) as err:
        await assert_run_status(engine, "bad", "completed")
    assert str(err.value) == "run 'bad': expected status 'completed', got 'failed' (nope)"
