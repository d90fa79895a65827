"""Start-run messages over real Redis: a store-less process asks the control plane to start a
run, and a durably worker runs it.

The published durable-worker 0.26.1's `Worker.start_run()` (in a subprocess) is the producer;
the control plane here is a bare `durably.Client` on SQLite with the gateway responder (a web
process without workflow code), so the runs are created by name and unpinned; a separate
engine on the same store then drives them. Unusable messages are logged and dropped without
stopping the consumer; a store failure is retried until the run exists.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import TenantGateway, WorkflowCtx
from durably._engine.gateway.server import Gateway
from durably._engine.gateway.wire import GatewaySettings
from durably._transport.redis_gateway import RedisGatewayChannel
from tests.remote import redis_support
from tests.remote.durable_worker_env import durable_worker_python
from tests.remote.redis_support import wait_for

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(600)  # the first run builds the SDK's virtualenv

SDK_START = """
import asyncio, sys
from durable_worker import Worker

url, prefix, tag = sys.argv[1], sys.argv[2], sys.argv[3]


async def main():
    acme = Worker("acme", redis=url, prefix=prefix, auto_register=False)
    await acme.start_run(
        tag + ".greet", {"name": "ada"}, run_id=tag + "-acme", tags=["sdk", "durable:parent:x"]
    )
    # Again, the same message: the gateway takes start jobs concurrently, so either copy may
    # be the one that creates the run; the other finds it.
    await acme.start_run(
        tag + ".greet", {"name": "ada"}, run_id=tag + "-acme", tags=["sdk", "durable:parent:x"]
    )
    await acme.start_run(tag + ".greet", {"name": "cy"})  # the control plane mints the id
    plain = Worker(redis=url, prefix=prefix, auto_register=False)
    await plain.start_run(tag + ".greet", {"name": "bob"}, run_id=tag + "-plain")
    print("sent", flush=True)


asyncio.run(main())
"""

SECRET = "a-test-secret-of-enough-length"


@asynccontextmanager
async def client_control_plane(
    db: Path, url: str, prefix: str, settings: GatewaySettings | None = None
) -> AsyncIterator[durably.Client]:
    """A control plane without workflow code: a Client with the gateway responder."""
    async with durably.Client(f"sqlite:///{db}", namespace=None) as client:
        gateway = Gateway(client, RedisGatewayChannel(url, prefix=prefix), settings=settings)
        await gateway.start()
        try:
            yield client
        finally:
            await gateway.close(1.0)


def greet_workflow(tag: str) -> Any:
    @durably.workflow(f"{tag}.greet")
    async def greet(ctx: WorkflowCtx, data: dict[str, str]) -> str:
        return f"hello {data['name']}"

    return greet


async def test_the_sdks_start_run_creates_the_run_in_the_tenants_namespace(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"sr{uuid.uuid4().hex[:8]}"
    db = tmp_path / "control.db"
    async with client_control_plane(db, redis_url, redis_prefix) as client:
        sent = await asyncio.to_thread(
            subprocess.run,
            [str(durable_worker_python()), "-c", SDK_START, redis_url, redis_prefix, tag],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert sent.returncode == 0 and "sent" in sent.stdout, sent.stderr

        async def three_runs() -> list[durably.WorkflowRun]:
            runs = await client.list_runs(workflow=f"{tag}.greet")
            return runs if len(runs) >= 3 else []

        runs = await wait_for(three_runs, what="three runs")
        await asyncio.sleep(0.3)
        runs = await client.list_runs(workflow=f"{tag}.greet")
        assert len(runs) == 3  # the start sent twice with one run id is one run
        by_id = {r.id: r for r in runs}
        acme = by_id[f"{tag}-acme"]
        assert acme.namespace == "acme" and acme.status == "pending"
        assert acme.workflow_version == ""  # registered nowhere here: unpinned
        assert acme.tags == ("sdk",)  # the engine-reserved tag was not taken
        assert acme.input == {"name": "ada"}
        assert by_id[f"{tag}-plain"].namespace == "default"  # no partition: its namespace
        minted = [r for r in runs if r.id not in (f"{tag}-acme", f"{tag}-plain")]
        assert len(minted) == 1 and minted[0].namespace == "acme"
        assert minted[0].input == {"name": "cy"}

        # A durably worker on the same store runs them (every namespace).
        async with durably.Engine(
            f"sqlite:///{db}", namespace=None, workflows=[greet_workflow(tag)], timer_poll_ms=50
        ):
            assert await client.result(f"{tag}-acme", timeout=20) == "hello ada"
            assert await client.result(f"{tag}-plain", timeout=20) == "hello bob"
            done = await client.get_run(f"{tag}-acme")
            assert done is not None and done.workflow_version == "1"


async def test_unusable_start_runs_are_logged_and_dropped_and_the_consumer_goes_on(
    redis_url: str,
    redis_prefix: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tag = f"sr{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.WARNING, logger="durably")
    raw = RedisGatewayChannel(redis_url, prefix=redis_prefix)
    settings = GatewaySettings(max_message_bytes=1_000)
    async with client_control_plane(tmp_path / "c.db", redis_url, redis_prefix, settings) as client:
        await client.start("other.workflow", {}, run_id=f"{tag}-taken")
        bad: list[dict[str, Any]] = [
            {"workflow": f"{tag}.greet", "input": {}, "runId": f"{tag}-no-tenant"},
            {"tenant": "acme", "input": {}, "runId": f"{tag}-no-workflow"},
            {"tenant": "ac me", "workflow": f"{tag}.greet", "runId": f"{tag}-bad-tenant"},
            {"tenant": "acme", "workflow": f"{tag}.greet", "runId": ""},
            {"tenant": "acme", "workflow": f"{tag}.greet", "runId": f"{tag}-x~retry~0a1b"},
            {"tenant": "acme", "workflow": f"{tag}.greet", "runId": f"{tag}-x.child.1"},
            {"tenant": "acme", "workflow": f"{tag}.greet", "runId": f"{tag}-taken"},
            {"tenant": "acme", "workflow": f"{tag}.greet", "tags": "t", "runId": f"{tag}-tags"},
            {
                "tenant": "acme",
                "workflow": f"{tag}.greet",
                "input": "x" * 2_000,
                "runId": f"{tag}-big",
            },
        ]
        try:
            for message in bad:
                await raw.start_run(message)
            await raw._queue(raw.start_run_queue).add("notStartRun", {"tenant": "acme"}, {})
            await raw.start_run(
                {"tenant": "acme", "workflow": f"{tag}.greet", "runId": f"{tag}-ok"}
            )
        finally:
            await raw.close()

        async def ok_run() -> durably.WorkflowRun | None:
            return await client.get_run(f"{tag}-ok")

        run = await wait_for(ok_run, what="the good run")
        assert run.namespace == "acme"
        listed = {r.id for r in await client.list_runs()}
        assert listed == {f"{tag}-taken", f"{tag}-ok"}
        taken = await client.get_run(f"{tag}-taken")
        assert taken is not None and taken.workflow == "other.workflow"
    dropped = [r.getMessage() for r in caplog.records if "dropped start-run job" in r.getMessage()]
    assert len(dropped) == len(bad)
    for message in bad:
        if message.get("runId"):
            assert any(repr(message["runId"])[:60] in line for line in dropped), message
    assert any("not a startRun message" in r.getMessage() for r in caplog.records)


async def test_a_store_failure_is_retried_until_the_run_exists(
    redis_url: str,
    redis_prefix: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tag = f"sr{uuid.uuid4().hex[:8]}"
    db = tmp_path / "control.db"
    caplog.set_level(logging.WARNING, logger="durably")
    async with client_control_plane(db, redis_url, redis_prefix) as client:
        await client.get_run("warm-up")
        # The runs table disappears under the store: every insert fails for a while.
        with sqlite3.connect(db) as conn:
            conn.execute("ALTER TABLE durable_workflow_runs RENAME TO runs_away")
        async with TenantGateway(redis_url, tenant="acme", prefix=redis_prefix) as gw:
            run_id = await gw.start(f"{tag}.greet", {"name": "ada"})
        await asyncio.sleep(0.6)
        assert any(
            "start-run job" in r.getMessage() and "attempt" in r.getMessage()
            for r in caplog.records
        )
        with sqlite3.connect(db) as conn:
            conn.execute("ALTER TABLE runs_away RENAME TO durable_workflow_runs")

        async def created() -> durably.WorkflowRun | None:
            return await client.get_run(run_id)

        run = await wait_for(created, timeout=20, what="the run after the store recovered")
        assert run.namespace == "acme" and run.input == {"name": "ada"}


async def test_with_a_secret_start_runs_must_be_signed(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"sr{uuid.uuid4().hex[:8]}"
    settings = GatewaySettings(secret=SECRET)
    token = TenantGateway.mint_token(SECRET, "acme")
    db = tmp_path / "control.db"
    async with client_control_plane(db, redis_url, redis_prefix, settings) as client:
        async with TenantGateway(redis_url, tenant="acme", prefix=redis_prefix) as unsigned:
            await unsigned.start(f"{tag}.greet", {}, run_id=f"{tag}-unsigned")
        forged = TenantGateway(redis_url, token=token, prefix=redis_prefix)
        async with forged:
            # a valid token of acme cannot start a run for globex
            await forged._channel.start_run(
                {
                    "tenant": "globex",
                    "token": token,
                    "workflow": f"{tag}.greet",
                    "runId": f"{tag}-f",
                }
            )
            signed_id = await forged.start(f"{tag}.greet", {}, run_id=f"{tag}-signed")

        async def signed() -> durably.WorkflowRun | None:
            return await client.get_run(signed_id)

        run = await wait_for(signed, what="the signed run")
        assert run.namespace == "acme"
        await asyncio.sleep(0.3)  # the refused ones were queued before it
        assert {r.id for r in await client.list_runs()} == {f"{tag}-signed"}

    # A control plane may accept durable-worker's unsigned start-runs on purpose.
    lenient = GatewaySettings(secret=SECRET, allow_unsigned_start_runs=True)
    async with client_control_plane(db, redis_url, redis_prefix, lenient) as client:
        async with TenantGateway(redis_url, tenant="acme", prefix=redis_prefix) as unsigned:
            rid = await unsigned.start(f"{tag}.greet", {})

        async def accepted() -> durably.WorkflowRun | None:
            return await client.get_run(rid)

        assert (await wait_for(accepted, what="the unsigned run")).namespace == "acme"
