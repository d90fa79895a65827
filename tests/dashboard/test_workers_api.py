"""The workers panel's API: `GET workers` (the store's groups, then the groups a transport
reports), `GET workers/directory` (what the live workers announce), their strict parameters,
and the metrics gauges of transport groups (labelled with the transport, so one token on two
brokers is two series). The full fleet with durable-worker is in
tests/remote/test_fleet_health.py."""

from __future__ import annotations

import pytest

import durably
from durably import Engine
from durably.dashboard import create_app
from durably.transports import RedisTransport
from tests.observe.support import value
from tests.remote import redis_support

from .conftest import FAST, client_for, wait_until

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix


async def test_an_engine_without_a_transport_answers_from_the_store(engine: Engine) -> None:
    async with client_for(create_app(engine)) as client:
        groups = (await client.get("/api/workers")).json()
        assert [g["group"] for g in groups] == ["runs@default"]
        assert "transport" not in groups[0]
        assert [w["instanceId"] for w in groups[0]["liveWorkers"]] == [engine.instance_id]
        res = await client.get("/api/workers/directory")
        assert res.status_code == 200
        body = res.json()
        assert (body["supported"], body["workflows"], body["otherPartitions"]) == (False, [], [])
        assert "No transport of this engine says which workers are live" in body["detail"]


@pytest.mark.parametrize(
    "path",
    [
        "/api/workers?group=x",
        "/api/workers/directory?namespace=acme",
        "/api/workers/directory?limit=5",
    ],
)
async def test_the_workers_routes_take_no_parameter(engine: Engine, path: str) -> None:
    async with client_for(create_app(engine)) as client:
        res = await client.get(path)
        assert res.status_code == 400, res.text
        name = path.split("?")[1].split("=")[0]
        assert f"`{name}`" in res.json()["message"]


async def test_a_transport_group_is_listed_and_measured(redis_url: str, redis_prefix: str) -> None:
    uid = redis_prefix[-6:]

    @durably.step(f"{uid}.thumb")
    async def thumb(x: int) -> int:
        return x

    transport = RedisTransport(redis_url, prefix=redis_prefix, instance_id="web-1")
    async with Engine(
        "memory", transport, role="both", workflows=[], steps=[thumb], **FAST
    ) as engine:
        async with client_for(create_app(engine)) as client:

            async def listed() -> bool:
                groups = (await client.get("/api/workers")).json()
                return any(g["group"] == f"{uid}.thumb" for g in groups)

            await wait_until(listed)
            groups = {g["group"]: g for g in (await client.get("/api/workers")).json()}
            served = groups[f"{uid}.thumb"]
            assert (served["kind"], served["transport"], served["depth"]) == ("step", "default", 0)
            [worker] = served["liveWorkers"]
            assert worker["instanceId"] == "web-1"
            assert worker["descriptor"]["steps"] == [f"{uid}.thumb"]
            assert worker["status"]["inFlight"] == 0
            metrics = (await client.get("/api/metrics")).text
            live = {"group": f"{uid}.thumb", "transport": "default"}
            assert value(metrics, "durable_group_live_workers", **live) == 1
            store_group = {"group": "runs@default", "transport": ""}
            assert value(metrics, "durable_group_queue_depth", **store_group) == 0
