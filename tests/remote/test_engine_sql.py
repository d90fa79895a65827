"""A durably engine whose steps run on other processes over the SQL transport (PostgreSQL).

The engine's store is a fresh PostgreSQL schema; its transport is a `SqlTransport` on the same
database with a table prefix of the test's own. The workers are the published `durable-worker`
0.26.1 (unmodified, its own `run_db_worker`, one poller per step token, in a subprocess of its
own virtualenv) and a `durably worker` process serving the same workloads. Results, `FatalError`
code and details, retries and the onError handoff must behave as they do with in-process steps.
"""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import durably
from durably.transports import SqlTransport
from tests.pg_support import PG_URL, fresh_schema, schema_url
from tests.remote.sql_support import create_tables, prefix_fixture  # noqa: F401
from tests.remote.step_workloads import SDK_STEPS, behaves_as_in_process, worker_app, workflows
from tests.remote.worker_process import durably_worker, sdk_script

pytestmark = pytest.mark.timeout(600)  # the first run builds the SDK's virtualenv

RESULT_TIMEOUT = 30

SDK_WORKER = """
import asyncio, sys

import asyncpg
from durable_worker import FatalError, Worker
from durable_worker.db_runner import run_db_worker

dsn, prefix, tag = sys.argv[1], sys.argv[2], sys.argv[3]

# The SDK's pool keeps 10 connections per poller and the test server is shared: the driver's
# default pool is made small. The SDK's own code runs as published.
_create_pool = asyncpg.create_pool
asyncpg.create_pool = lambda dsn, **kw: _create_pool(dsn, min_size=1, max_size=2, **kw)

# STEPS


async def main():
    # run_db_worker serves ONE group per call: one poller per step token. The tables exist
    # already (the SDK's concurrent CREATE TABLE IF NOT EXISTS would race on the catalog).
    pollers = [
        run_db_worker(worker, group=tag + suffix, dsn=dsn, dialect="postgres", prefix=prefix,
                      poll_ms=50, auto_create=False)
        for suffix in (".echo", ".fatal", ".flaky")
    ]
    print("ready", flush=True)
    await asyncio.gather(*pollers)


asyncio.run(main())
""".replace("# STEPS\n", SDK_STEPS)


def _dsn() -> str:
    """`PG_URL` as asyncpg (the SDK's driver) takes it."""
    scheme, sep, rest = PG_URL.partition("://")
    return f"postgresql{sep}{rest}" if scheme.startswith("postgres") else PG_URL


@contextmanager
def _sdk_worker(prefix: str, tag: str, tmp_path: Path) -> Iterator[None]:
    script = tmp_path / "sdk_db_worker.py"
    script.write_text(SDK_WORKER)
    with sdk_script(script, [_dsn(), prefix, tag], tmp_path / "sdk.log"):
        yield


@contextmanager
def _durably_worker(prefix: str, tag: str, tmp_path: Path) -> Iterator[None]:
    module = tmp_path / f"stepapp_{tag.replace('-', '_')}.py"
    source = worker_app(
        transport_import="from durably._transport.sql import SqlTransport",
        transport="SqlTransport(URL, prefix=PREFIX, poll_ms=50, pool_size=2)",
        url=PG_URL,
        prefix=prefix,
        tag=tag,
    )
    module.write_text(textwrap.dedent(source))
    with durably_worker(f"{module.stem}:app", tmp_path / f"{module.stem}.log", cwd=tmp_path):
        yield


@pytest.fixture
async def store_url() -> AsyncIterator[str]:
    """The engine's store: a fresh PostgreSQL schema, dropped afterwards."""
    async with fresh_schema() as schema:
        yield schema_url(schema)


@pytest.mark.parametrize("server", ["durable-worker", "durably"])
async def test_remote_steps_behave_as_in_process_steps(
    server: str, prefix: str, store_url: str, tmp_path: Path
) -> None:
    tag = f"{prefix}-{server}"
    wfs = workflows(tag)
    # The tables first: the SDK's pollers are started with auto_create=False.
    await create_tables(prefix)
    serving = (
        _sdk_worker(prefix, tag, tmp_path)
        if server == "durable-worker"
        else _durably_worker(prefix, tag, tmp_path)
    )
    engine = durably.Engine(
        store_url,
        transport=SqlTransport(PG_URL, prefix=prefix, poll_ms=50, pool_size=2),
        workflows=list(wfs.values()),
        steps=[],  # an orchestrator: every step runs on the worker
        timer_poll_ms=50,
    )
    with serving:
        async with engine:
            await behaves_as_in_process(engine, wfs, tag, server)
