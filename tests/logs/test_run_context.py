"""The run context of log records: durably's loggers (and a user's logger with
`durably.RunContextFilter`) stamp `run_id`, `workflow`, `step` and `seq` on records logged in
a turn or a step attempt; `ctx.logger` logs each line once however often the body replays;
an idle engine logs nothing per poll; the logger hierarchy."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import InMemoryStateStore, StepContext, WorkflowCtx
from durably._core.log_context import RunContextFilter, durably_logger
from durably._engine.defs.events import EngineEvent
from durably._store.sql import SqlStateStore
from tests.engine_support import FAST_TUNING, RESULT_TIMEOUT, EngineFactory, wait_until


def _context(record: logging.LogRecord) -> tuple[Any, ...]:
    return tuple(record.__dict__.get(k) for k in ("run_id", "workflow", "step", "seq"))


async def test_records_in_a_step_carry_the_run_and_step(
    engine_factory: EngineFactory, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = logging.getLogger(f"app.{uid}")
    app.addFilter(durably.RunContextFilter())

    @durably.step(name=f"{uid}.sync")
    def sync_step(x: int) -> int:
        app.info("in the sync step")  # on the pool thread
        return x

    @durably.step(name=f"{uid}.async")
    async def async_step(x: int, log: StepContext) -> int:
        app.info("in the async step")
        log.info("progress")  # a step.progress event: the failing listener logs under it
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        await ctx.step(sync_step, x)
        app.info("in the body")
        return await ctx.step(async_step, x)

    def faulty(event: EngineEvent) -> None:
        if event.type == "step.progress":
            raise RuntimeError("listener bug")

    caplog.set_level(logging.INFO)
    async with engine_factory() as engine:
        engine.subscribe(faulty)
        handle = await engine.start(wf, 1, run_id=f"{uid}-r")
        assert await handle.result(timeout=RESULT_TIMEOUT) == 1

    run, wf_name = f"{uid}-r", f"{uid}.wf"
    mine = [r for r in caplog.records if r.name == f"app.{uid}"]
    by_message = {r.getMessage(): _context(r) for r in mine}
    assert by_message["in the sync step"] == (run, wf_name, f"{uid}.sync", 0)
    assert by_message["in the async step"] == (run, wf_name, f"{uid}.async", 1)
    assert by_message["in the body"] == (run, wf_name, None, None)
    # durably's own record (the failing listener, logged by the engine) carries them without
    # the user adding anything.
    engine_records = [
        r for r in caplog.records if r.getMessage() == "durably event listener failed"
    ]
    assert engine_records and engine_records[0].name == "durably.engine"
    assert _context(engine_records[0]) == (run, wf_name, f"{uid}.async", 1)


async def test_ctx_logger_logs_once_across_replays(
    engine_factory: EngineFactory, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    entered: list[int] = []

    @durably.step(name=f"{uid}.s")
    async def s(i: int) -> int:
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        entered.append(1)
        for i in range(3):
            await ctx.step(s, i)
            ctx.logger.info("after step %d", i)
        return "done"

    logger_name = f"durably.workflow.{uid}.wf"
    caplog.set_level(logging.INFO, logger=logger_name)
    async with engine_factory() as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        assert await handle.result(timeout=RESULT_TIMEOUT) == "done"

    lines = [r for r in caplog.records if r.name == logger_name]
    assert [r.getMessage() for r in lines] == ["after step 0", "after step 1", "after step 2"]
    assert {_context(r) for r in lines} == {(f"{uid}-r", f"{uid}.wf", None, None)}
    if engine_factory.replay:
        assert len(entered) >= 4  # the body ran again after each step: replayed 3 times
    else:
        assert len(entered) == 1


def _counting(kind: str, tmp_path: Path) -> Any:
    """A real store (memory or SQLite) counting the poller's passes (one due-timer listing
    each)."""

    class Counted:
        passes = 0

        async def list_due_timers(self, *args: Any, **kwargs: Any) -> Any:
            type(self).passes += 1
            return await super().list_due_timers(*args, **kwargs)  # type: ignore[misc]

    if kind == "memory":
        return type("CountedMemory", (Counted, InMemoryStateStore), {})()
    url = f"sqlite+aiosqlite:///{tmp_path / 'idle.db'}"
    return type("CountedSql", (Counted, SqlStateStore), {}).from_url(url)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_an_idle_engine_logs_nothing_per_poll(
    kind: str, tmp_path: Path, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = _counting(kind, tmp_path)

    @durably.workflow(f"{uid}.none")
    async def never(ctx: WorkflowCtx) -> None:
        return None

    schedule = durably.Schedule(f"{uid}.sched", f"{uid}.none", cron="0 0 1 1 *")
    try:
        async with durably.Engine(store=store, schedules=[schedule], **FAST_TUNING):
            await wait_until(_passes(store, 3))  # started: boot lines are allowed
            caplog.clear()
            caplog.set_level(logging.DEBUG, logger="durably")
            start = store.passes
            await wait_until(_passes(store, start + 20))
            records = [r for r in caplog.records if r.name.startswith("durably")]
    finally:
        await store.close()
    assert records == [], [f"{r.name}: {r.getMessage()}" for r in records]


def _passes(store: Any, n: int) -> Any:
    async def reached() -> bool:
        return int(store.passes) >= n

    return reached


def test_the_filter_keeps_explicit_values_and_fills_none() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    record.run_id = "given"
    assert RunContextFilter().filter(record) is True
    assert _context(record) == ("given", None, None, None)


def test_durably_loggers_live_under_durably() -> None:
    logger = durably_logger("durably.engine")
    assert logger.name == "durably.engine" and logger.parent is logging.getLogger("durably")
    assert sum(isinstance(f, RunContextFilter) for f in logger.filters) == 1
    durably_logger("durably.engine")  # asking twice adds it once
    assert sum(isinstance(f, RunContextFilter) for f in logger.filters) == 1
    with pytest.raises(ValueError, match="under 'durably'"):
        durably_logger("app")
