"""An Engine with a Redis transport answers tenants by itself: a store-less `TenantGateway`
starts a run in its namespace and reads it back, and cannot read another tenant's run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import durably
from durably import WorkflowCtx
from durably.tenant import TenantRequestError
from durably.transports import RedisTransport
from tests.remote import redis_support

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix


async def test_an_engine_answers_tenants_over_its_transport(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"gw-{redis_prefix}"

    @durably.workflow(f"{tag}.hello")
    async def hello(ctx: WorkflowCtx, name: str) -> str:
        return f"hello {name}"

    engine = durably.Engine(
        f"sqlite:///{tmp_path / 'e.db'}",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[hello],
        namespace=None,  # an operator engine: it drives every tenant's runs
        timer_poll_ms=50,
    )
    async with engine:
        async with durably.TenantGateway(redis_url, tenant="acme", prefix=redis_prefix) as acme:
            run_id = await acme.start(f"{tag}.hello", "acme", run_id=f"{tag}-a")
            # The start travels as a message: the run exists once the engine took it.
            async with asyncio.timeout(20):
                while await engine.get_run(run_id) is None:  # noqa: ASYNC110 - a store row
                    await asyncio.sleep(0.05)
            run = await engine.wait_for_run(run_id, timeout=20, until="terminal")
            assert (run.status, run.namespace, run.output) == ("completed", "acme", "hello acme")
            detail = await acme.get_run_detail(run_id)
            assert detail is not None
        async with durably.TenantGateway(redis_url, tenant="other", prefix=redis_prefix) as other:
            with pytest.raises(TenantRequestError) as info:
                await asyncio.wait_for(other.get_run_detail(run_id), 20)
            assert info.value.code == "cross-tenant"
