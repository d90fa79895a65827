"""Run ids obey one rule on every store: a non-empty, printable str of at most 255 bytes of
UTF-8. A bad id is refused with `InvalidRunIdError` before any store call, so nothing is
created and every store answers alike (PostgreSQL used to fail with a raw driver error on a
NUL, and `run_id=""` silently became a random id).

Ids the engine derives from a run id (children, fan members, retries, continuations) obey the
same rule: one that would be too long fails that start clearly instead of being written.

Each test runs on the in-memory store, an SQLite file and a fresh PostgreSQL schema.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Engine, InvalidRunIdError, WorkflowCtx, WorkflowRun
from tests.cli.support import durably as durably_cli
from tests.cli.support import write_app
from tests.engine_support import EngineFactory, wait_until
from tests.pg_support import fresh_schema

RESULT_TIMEOUT = 20.0
# The documented bound on a run id's length, in bytes of UTF-8.
MAX_RUN_ID_BYTES = 255

# (id, the rule it breaks, text the message must show)
INVALID_IDS = [
    pytest.param("", "empty", "must not be empty", id="empty"),
    pytest.param("a\x00b", "not_printable", r"'a\x00b'", id="nul"),
    pytest.param("\n", "not_printable", r"'\n'", id="newline"),
    pytest.param("order\t42", "not_printable", "U+0009", id="tab"),
    pytest.param("pay\u202eevil", "not_printable", "U+202E", id="bidi-override"),
    pytest.param("x" * 256, "too_long", "256 bytes", id="256-bytes"),
    pytest.param("é" * 128, "too_long", "256 bytes", id="256-bytes-unicode"),
]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def factory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EngineFactory]:
    if request.param != "postgres":
        yield EngineFactory(request.param, "hot", tmp_path)
        return
    async with fresh_schema(create=False) as schema:
        yield EngineFactory("postgres", "hot", tmp_path, pg_schema=schema)


@pytest.fixture
def wfs(uid: str) -> dict[str, Any]:
    """Workflows under names unique to this test (the registry is process-global)."""

    @durably.workflow(f"{uid}-echo")
    async def echo(ctx: WorkflowCtx, x: Any) -> Any:
        return x

    @durably.workflow(f"{uid}-parent")
    async def parent(ctx: WorkflowCtx, child_id: str | None) -> Any:
        return await ctx.child(echo, "hi", id=child_id)

    @durably.workflow(f"{uid}-spawner")
    async def spawner(ctx: WorkflowCtx, child_id: str | None) -> Any:
        return await ctx.start_child(echo, "hi", id=child_id)

    @durably.workflow(f"{uid}-fan")
    async def fan(ctx: WorkflowCtx, n: int) -> Any:
        return await ctx.all(echo, list(range(n)))

    @durably.workflow(f"{uid}-again")
    async def again(ctx: WorkflowCtx, n: int) -> Any:
        if n > 0:
            ctx.continue_as_new(n - 1)
        return "done"

    return {"echo": echo, "parent": parent, "spawner": spawner, "fan": fan, "again": again}


def _engine(factory: EngineFactory, wfs: dict[str, Any]) -> Engine:
    return factory(workflows=list(wfs.values()))


async def _exists(engine: Engine, run_id: str) -> bool:
    return await engine.get_run(run_id) is not None


async def _settled(engine: Engine, run_id: str) -> WorkflowRun:
    """The run once terminal (a parent suspends while its child's start is tried)."""
    return await engine.wait_for_run(run_id, timeout=RESULT_TIMEOUT, until="terminal")


# ------------------------------------------------------------------ start


@pytest.mark.parametrize(("run_id", "rule", "shown"), INVALID_IDS)
async def test_start_refuses_a_bad_id_and_creates_nothing(
    factory: EngineFactory, wfs: dict[str, Any], run_id: str, rule: str, shown: str
) -> None:
    async with _engine(factory, wfs) as engine:
        with pytest.raises(InvalidRunIdError) as caught:
            await engine.start(wfs["echo"], 1, run_id=run_id)
        assert await engine.list_runs() == []
    assert caught.value.rule == rule
    assert caught.value.run_id == run_id
    assert shown in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "run_id",
    [
        pytest.param("x" * MAX_RUN_ID_BYTES, id="255-bytes"),
        pytest.param("é" * 127 + "x", id="255-bytes-unicode"),
        pytest.param("заказ 42 / 注文 🚀", id="unicode-and-space"),
    ],
)
async def test_ids_up_to_255_bytes_are_accepted(
    factory: EngineFactory, wfs: dict[str, Any], run_id: str
) -> None:
    assert len(run_id.encode()) <= MAX_RUN_ID_BYTES
    async with _engine(factory, wfs) as engine:
        handle = await engine.start(wfs["echo"], 7, run_id=run_id)
        assert handle.run_id == run_id
        assert await handle.result(timeout=RESULT_TIMEOUT) == 7
        run = await engine.get_run(run_id)
    assert run is not None and run.id == run_id


async def test_no_id_still_gets_a_generated_one(
    factory: EngineFactory, wfs: dict[str, Any]
) -> None:
    async with _engine(factory, wfs) as engine:
        handle = await engine.start(wfs["echo"], 1)
        assert handle.run_id
        assert await handle.result(timeout=RESULT_TIMEOUT) == 1


async def test_a_bad_id_is_refused_before_the_store_is_opened(tmp_path: Path, uid: str) -> None:
    @durably.workflow(f"{uid}-w")
    async def w(ctx: WorkflowCtx, x: int) -> int:
        return x

    path = tmp_path / "untouched.db"
    engine = Engine(f"sqlite:///{path}", workflows=[w])
    try:
        with pytest.raises(InvalidRunIdError):
            await engine.start(w, 1, run_id="")
    finally:
        await engine.close()
    assert not path.exists()


# ------------------------------------------------------------------ retry_with_input


@pytest.mark.parametrize(("new_run_id", "rule", "shown"), INVALID_IDS[:3])
async def test_retry_with_input_refuses_a_bad_new_id(
    factory: EngineFactory, wfs: dict[str, Any], new_run_id: str, rule: str, shown: str
) -> None:
    async with _engine(factory, wfs) as engine:
        handle = await engine.start(wfs["echo"], 1, run_id="source")
        await handle.result(timeout=RESULT_TIMEOUT)
        with pytest.raises(InvalidRunIdError, match="new run id") as caught:
            await engine.retry_with_input("source", 2, new_run_id=new_run_id)
        assert [r.id for r in await engine.list_runs()] == ["source"]
    assert caught.value.rule == rule
    assert shown in str(caught.value)


async def test_a_retry_id_derived_from_a_long_id_is_refused_clearly(
    factory: EngineFactory, wfs: dict[str, Any]
) -> None:
    source = "r" * 250  # `~retry~` and 8 hex digits make it 265 bytes
    async with _engine(factory, wfs) as engine:
        handle = await engine.start(wfs["echo"], 1, run_id=source)
        await handle.result(timeout=RESULT_TIMEOUT)
        with pytest.raises(InvalidRunIdError, match="265 bytes") as caught:
            await engine.retry_with_input(source, 2)
        assert caught.value.rule == "too_long"
        assert [r.id for r in await engine.list_runs()] == [source]
        # With an id of its own the retry goes through.
        new_id = await engine.retry_with_input(source, 3, new_run_id="fixed")
        assert new_id == "fixed"
        assert await engine.get_handle("fixed").result(timeout=RESULT_TIMEOUT) == 3


# ------------------------------------------------------------------ children


@pytest.mark.parametrize("workflow", ["parent", "spawner"])
@pytest.mark.parametrize(("child_id", "rule", "shown"), INVALID_IDS[:3])
async def test_a_bad_child_id_fails_the_parent_naming_it(
    factory: EngineFactory,
    wfs: dict[str, Any],
    workflow: str,
    child_id: str,
    rule: str,
    shown: str,
) -> None:
    async with _engine(factory, wfs) as engine:
        handle = await engine.start(wfs[workflow], child_id, run_id="p")
        run = await _settled(engine, handle.run_id)
        assert run.status == "failed", run
        assert run.error is not None
        assert "invalid child run id" in run.error.message
        assert shown in run.error.message
        assert [r.id for r in await engine.list_runs()] == ["p"]  # no child was created


async def test_a_child_id_derived_from_a_long_parent_id_fails_clearly(
    factory: EngineFactory, wfs: dict[str, Any]
) -> None:
    parent_id = "p" * 250  # its first child would be `<id>.child.0`: 258 bytes
    async with _engine(factory, wfs) as engine:
        handle = await engine.start(wfs["parent"], None, run_id=parent_id)
        run = await _settled(engine, handle.run_id)
        assert run.status == "failed", run
        assert run.error is not None
        assert "failed to start" in run.error.message
        assert "bytes of UTF-8, run ids are at most 255" in run.error.message
        assert [r.id for r in await engine.list_runs()] == [parent_id]
        # A parent id that leaves room for the suffix has its child.
        ok = await engine.start(wfs["parent"], None, run_id="p" * 240)
        assert await ok.result(timeout=RESULT_TIMEOUT) == "hi"


async def test_fan_members_derived_from_a_long_parent_id_fail_clearly(
    factory: EngineFactory, wfs: dict[str, Any]
) -> None:
    parent_id = "f" * 250
    async with _engine(factory, wfs) as engine:
        handle = await engine.start(wfs["fan"], 2, run_id=parent_id)
        run = await _settled(engine, handle.run_id)
        assert run.status == "failed", run
        assert run.error is not None
        assert "failed" in run.error.message
        assert [r.id for r in await engine.list_runs()] == [parent_id]


# ------------------------------------------------------------------ continue-as-new


async def test_a_continuation_id_that_would_be_too_long_fails_the_run_not_the_chain(
    factory: EngineFactory, wfs: dict[str, Any]
) -> None:
    long_id = "c" * 254  # `~1` makes 256 bytes
    fits = "d" * 253  # `~1` makes 255 bytes
    async with _engine(factory, wfs) as engine:
        refused = await engine.start(wfs["again"], 1, run_id=long_id)
        run = await _settled(engine, refused.run_id)
        assert run.status == "failed", run  # not completed with its continuation lost
        assert run.error is not None
        assert "continuation run id" in run.error.message
        assert await engine.get_run(f"{long_id}~1") is None

        first = await engine.start(wfs["again"], 1, run_id=fits)
        assert (await _settled(engine, first.run_id)).status == "completed"
        # The continuation is started just after the first run completes.
        await wait_until(lambda: _exists(engine, f"{fits}~1"), timeout=RESULT_TIMEOUT)
        assert await engine.get_handle(f"{fits}~1").result(timeout=RESULT_TIMEOUT) == "done"


# ------------------------------------------------------------------ CLI


def test_the_cli_refuses_a_bad_run_id(tmp_path: Path) -> None:
    write_app(tmp_path)
    result: subprocess.CompletedProcess[str] = durably_cli(
        "start", "app:engine", "hello", "--input", '"ada"', "--run-id", "two\nlines", cwd=tmp_path
    )
    assert result.returncode == 2, result
    assert "--run-id" in result.stderr
    assert r"'two\nlines'" in result.stderr
    assert "printable" in result.stderr
    assert not (tmp_path / "app.db").exists()
