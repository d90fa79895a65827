"""Starts by name against a fleet whose workflows run in remote workflow workers: a published
durable-worker 0.26.1 process serves `<tag>.order` over real Redis, a durably control plane
(`workflows=[]`) copies what that worker announces into its heartbeat row, and a `Client`
with only the store starts the name and is refused a typo of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from durably import Client, Engine, WorkflowNotFoundError
from durably.transports import RedisTransport
from tests.engine_support import wait_until
from tests.remote import redis_support
from tests.remote.test_fleet_health import sdk_python, sdk_worker

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix
__all__ = ["sdk_python"]  # the fixture, imported for this module's tests

pytestmark = pytest.mark.timeout(600)  # the first run builds the SDK's virtualenv


async def test_a_remote_workflow_is_startable_by_name_and_its_typo_refused(
    sdk_python: Path, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"fs-{redis_prefix}"
    store = f"sqlite:///{tmp_path / 'plane.db'}"
    with sdk_worker(sdk_python, redis_url, redis_prefix, tag, "declined"):
        plane = Engine(
            store,
            transport=RedisTransport(redis_url, prefix=redis_prefix),
            workflows=[],
            role="control",
        )
        async with plane, Client(store) as client:

            async def announced() -> bool:
                rows = await client.store.list_worker_beats("default", 0, 10)
                return any(f"{tag}.order" in r.announced for r in rows)

            await wait_until(announced, timeout=20)  # at the first beat, or the next one
            handle = await client.start(f"{tag}.order", {})
            assert await client.get_run(handle.run_id) is not None
            with pytest.raises(WorkflowNotFoundError) as refused:
                await client.start(f"{tag}.ordr", {})
    assert f"did you mean '{tag}.order'" in str(refused.value)
