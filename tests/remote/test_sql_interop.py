"""The SQL transport against the published `durable-worker` 0.26.1 SDK, unmodified.

The SDK runs in a subprocess with its own interpreter (tests/remote/durable_worker_env.py)
and its own `run_db_worker`, one poller per step token as a Python worker serving several step
names does; durably dispatches with `SqlTransport.dispatch` and checks what its result drain
hands the sink.
"""

from __future__ import annotations

import asyncio
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durably import StepError
from tests.pg_support import PG_URL, require_pg, services_required
from tests.remote.durable_worker_env import durable_worker_python
from tests.remote.sql_support import (
    RecordingSink,
    db_fixture,  # noqa: F401
    drop_tables,
    eventually,
    prefix_fixture,  # noqa: F401
    rows,
    task,
    transport,
)

pytestmark = pytest.mark.timeout(300)

TOKENS = ("interop.ok", "interop.fatal", "interop.plain")

WORKER = textwrap.dedent(
    """
    import asyncio, sys

    import asyncpg
    from durable_worker import FatalError, Worker
    from durable_worker.db_runner import run_db_worker

    dsn, prefix, mode = sys.argv[1], sys.argv[2], sys.argv[3]

    # The SDK's pool would keep 10 connections per poller; the test server is shared, so the
    # driver's default pool is made small. The SDK's own code runs as published.
    _create_pool = asyncpg.create_pool
    asyncpg.create_pool = lambda dsn, **kw: _create_pool(dsn, min_size=1, max_size=2, **kw)

    worker = Worker()

    @worker.step("interop.ok")
    def ok(data):
        return {"doubled": data["n"] * 2, "seen": data}

    @worker.step("interop.fatal")
    def fatal(data):
        raise FatalError("nope", code="E1", details={"k": 1})

    @worker.step("interop.plain")
    def plain(data):
        raise ValueError("plain failure")

    async def main():
        if mode == "create":  # create the tables the SDK way, then stop
            done = asyncio.Event()
            done.set()
            await run_db_worker(worker, group="unused", dsn=dsn, dialect="postgres",
                                prefix=prefix, stop=done)
            return
        pollers = [
            run_db_worker(worker, group=token, dsn=dsn, dialect="postgres", prefix=prefix,
                          poll_ms=50, auto_create=False)
            for token in sys.argv[4:]
        ]
        print("serving", flush=True)
        await asyncio.gather(*pollers)

    asyncio.run(main())
    """
)


@pytest.fixture(scope="module")
def sdk_python() -> Path:
    try:
        return durable_worker_python()
    except (subprocess.SubprocessError, OSError) as exc:
        message = f"cannot install durable-worker 0.26.1: {exc}"
        if services_required():
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "sdk_worker.py"
    path.write_text(WORKER)
    return path


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """SDK subprocesses started by a test, killed at its end whatever happened."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _serve(python: Path, script: Path, prefix: str, log_path: Path) -> subprocess.Popen[str]:
    """The SDK serving TOKENS on the tables of `prefix`, its output in `log_path`."""
    with open(log_path, "w") as log_file:
        return subprocess.Popen(
            [str(python), str(script), _dsn(), prefix, "serve", *TOKENS],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            text=True,
        )


def _dsn() -> str:
    scheme, sep, rest = PG_URL.partition("://")
    return f"postgresql{sep}{rest}" if scheme.startswith("postgres") else PG_URL


async def _columns(db: Any, table: str) -> list[tuple[Any, ...]]:
    found = await db.fetch(
        "SELECT a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull "
        "FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 "
        "AND NOT a.attisdropped ORDER BY a.attnum",
        f'"{table}"',
    )
    return [tuple(row) for row in found]


async def _primary_key(db: Any, table: str) -> list[str]:
    found = await db.fetch(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass($1) AND i.indisprimary",
        f'"{table}"',
    )
    return [row["attname"] for row in found]


async def test_the_tables_are_the_ones_the_sdk_creates(
    sdk_python: Path, script: Path, prefix: str, db: Any
) -> None:
    sdk_prefix = f"s{uuid.uuid4().hex[:12]}"
    try:
        created = await asyncio.to_thread(
            subprocess.run,
            [str(sdk_python), str(script), _dsn(), sdk_prefix, "create"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr
        t = transport(prefix)
        await t.open()
        await t.close()
        for kind in ("tasks", "results"):
            ours, theirs = f"{prefix}_transport_{kind}", f"{sdk_prefix}_transport_{kind}"
            assert await _columns(db, ours) == await _columns(db, theirs)
            assert await _primary_key(db, ours) == await _primary_key(db, theirs) == ["step_id"]
            assert await _columns(db, ours)  # the tables exist at all
        # Our DDL on the SDK's tables adds the index (and triggers), changes no column.
        before = await _columns(db, f"{sdk_prefix}_transport_tasks")
        t = transport(sdk_prefix)
        await t.open()
        await t.close()
        assert await _columns(db, f"{sdk_prefix}_transport_tasks") == before
    finally:
        await drop_tables(sdk_prefix)


async def test_results_of_the_sdk_worker_reach_the_sink(
    sdk_python: Path,
    script: Path,
    prefix: str,
    db: Any,
    tmp_path: Path,
    processes: list[subprocess.Popen[str]],
) -> None:
    await require_pg()
    # Long poll: the SDK never notifies, so its results arrive through the table trigger.
    t = transport(prefix, poll_ms=30_000)
    await t.open()  # the tables exist before the SDK's pollers start
    log_path = tmp_path / "sdk.log"
    processes.append(_serve(sdk_python, script, prefix, log_path))
    sink = RecordingSink()
    try:
        await t.start(sink)
        begun = time.monotonic()
        await t.dispatch(task("run-i", 0, "interop.ok", {"n": 21, "s": "é"}))
        await t.dispatch(task("run-i", 1, "interop.fatal", None))
        await t.dispatch(task("run-i", 2, "interop.plain", [1, 2]))
        try:
            results = await sink.wait_for(3, timeout=60)
        except TimeoutError:
            pytest.fail(f"no results from the SDK worker; its output:\n{log_path.read_text()}")
        assert processes[0].poll() is None, log_path.read_text()
        # Well before the next poll: the trigger's NOTIFY woke the drain.
        assert time.monotonic() - begun < 20
        by_seq = {result.seq: result for result in results}
        ok, fatal, plain = by_seq[0], by_seq[1], by_seq[2]
        assert (ok.step_id, ok.status, ok.error) == ("run-i:0", "completed", None)
        assert ok.output == {"doubled": 42, "seen": {"n": 21, "s": "é"}}
        assert isinstance(ok.started_at, int) and ok.events == ()
        assert (fatal.step_id, fatal.status) == ("run-i:1", "failed")
        assert fatal.error == StepError(
            message="nope", code="E1", details={"k": 1}, retryable=False
        )
        assert (plain.step_id, plain.status) == ("run-i:2", "failed")
        assert plain.error == StepError(message="plain failure")
        assert plain.error.retryable is None and plain.error.code is None
        assert plain.output is None and fatal.output is None

        async def drained() -> bool:
            return not await rows(db, prefix, "tasks") and not await rows(db, prefix, "results")

        await eventually(drained)
    finally:
        await t.close()
