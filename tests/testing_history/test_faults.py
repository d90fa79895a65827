"""`fail_once` / `fail_times`: step bodies that raise on their first calls, run as real
steps with retries in an engine over an SQLite file."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import durably
from durably.testing import assert_step_attempts, fail_once, fail_times


class Declined(Exception):
    pass


async def _run(tmp_path: Path, step: durably.Step[Any, Any], name: str) -> durably.WorkflowRun:
    @durably.workflow(name)
    async def wf(ctx: durably.WorkflowCtx, _: None) -> Any:
        return await ctx.step(step)

    async with durably.Engine(f"sqlite:///{tmp_path / 'f.db'}", workflows=[wf]) as engine:
        await engine.start(wf, None, run_id=name)
        run = await engine.wait_for_run(name, timeout=30, until="terminal")
        if run.status == "completed":
            await assert_step_attempts(engine, name, {step.name: 3})
        return run


async def test_fail_times_is_retried_to_its_value(tmp_path: Path) -> None:
    flaky = durably.step("faults.flaky", retries=5, backoff_ms=1)(fail_times(2, "ok"))
    run = await _run(tmp_path, flaky, "faults-ok")
    assert run.status == "completed" and run.output == "ok"


async def test_too_few_retries_fail_with_the_injected_error(tmp_path: Path) -> None:
    flaky = durably.step("faults.short", retries=2, backoff_ms=1)(
        fail_times(2, "ok", error=Declined("card declined"))
    )
    run = await _run(tmp_path, flaky, "faults-short")
    assert run.status == "failed"
    assert run.error is not None and "card declined" in run.error.message


async def test_the_default_error_names_the_call() -> None:
    body = fail_times(2, 7)
    for call in (1, 2):
        with pytest.raises(RuntimeError, match=f"injected failure {call} of 2"):
            await body("ignored", key="ignored")
    assert await body() == 7 and await body() == 7
    once = fail_once("v", error=Declined)
    with pytest.raises(Declined, match="injected failure 1 of 1"):
        await once()
    assert await once() == "v"


async def test_each_body_counts_alone_and_counts_across_threads() -> None:
    a, b = fail_once(1), fail_once(2)
    with pytest.raises(RuntimeError):
        await a()
    with pytest.raises(RuntimeError):
        await b()  # its own counter: still fails once
    body = fail_times(50, "done")
    outcomes: list[str] = []
    lock = threading.Lock()

    def call() -> None:
        try:
            asyncio.run(body())
            result = "ok"
        except RuntimeError:
            result = "failed"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=call) for _ in range(80)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("failed") == 50 and outcomes.count("ok") == 30


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="a whole number >= 0"):
        fail_times(-1, "x")
    with pytest.raises(ValueError, match="a whole number >= 0"):
        fail_times(True, "x")
    with pytest.raises(TypeError, match="exception instance or class"):
        fail_times(1, "x", error="boom")  # type: ignore[arg-type]
