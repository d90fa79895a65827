"""One controller written against `durably.RunGateway` works over a store-backed `Client`
and over a store-less `TenantGateway` (real Redis) alike.

The runs are started elsewhere (by the control-plane engine, in the tenant's namespace);
the controller only sees the gateway. It lists them with what they wait on, reads their
detail and facets, follows one run's live events while it cancels it, retries a failed run
in place and replays it with a fixed input — and both gateways give it the same answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import EngineEvent, RunGateway, WorkflowCtx
from durably.transports import RedisTransport
from tests.remote import redis_support

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(120)

TENANT = "acme"
WAIT = 20.0


async def until(check: Callable[[], Any], timeout: float = WAIT) -> Any:
    """Poll the async `check` until it answers something truthy; that answer."""
    async with asyncio.timeout(timeout):
        while not (answer := await check()):  # noqa: ASYNC110 - polls the gateway
            await asyncio.sleep(0.05)
    return answer


async def controller(gateway: RunGateway, workflows: dict[str, str]) -> dict[str, Any]:
    """What a web tier does, through nothing but the Protocol: the runs of `workflows`
    (`wait` waits for a signal, `fail` fails on a negative input) were started elsewhere."""
    report: dict[str, Any] = {"role": gateway.topology()["role"]}

    async def both_settled() -> list[durably.RunListItem] | None:
        items = await gateway.list_run_items(workflows=sorted(workflows.values()))
        settled = [i for i in items if i.run.status in ("suspended", "failed")]
        return items if len(settled) == 2 else None

    items = await until(both_settled)
    by_workflow = {i.run.workflow: i for i in items}
    waiting = by_workflow[workflows["wait"]]
    failing = by_workflow[workflows["fail"]]
    assert waiting.waiting is not None
    report["waiting_on"] = waiting.waiting.on
    report["failed_code"] = failing.run.error.code if failing.run.error else None
    wait_id, fail_id = waiting.run.id, failing.run.id

    detail = await gateway.get_run_detail(wait_id)
    assert detail is not None
    report["detail"] = (detail.run.id == wait_id, detail.run.status)
    report["get_run"] = (await gateway.get_run(fail_id) or failing.run).status
    report["unknown"] = await gateway.get_run(f"{wait_id}-nope")
    report["waiting_for"] = {k: v.on for k, v in (await gateway.waiting_for([wait_id])).items()}
    facets = await gateway.run_facets(workflows=sorted(workflows.values()))
    report["facets"] = sorted((f.status, f.count) for f in facets)
    values = await gateway.run_value_facets("workflow", workflows=sorted(workflows.values()))
    report["values"] = sorted((v.value, v.count) for v in values)
    report["health_is_a_list"] = isinstance(await gateway.worker_health(), list)
    report["continue"] = await gateway.continue_run(wait_id)  # no breakpoint to release
    redispatched = await gateway.redispatch_pending(wait_id)
    report["redispatched"] = redispatched["redispatched"] if redispatched else None

    # Follow the waiting run while cancelling it: its end arrives as an event.
    events: list[EngineEvent] = []
    ended = asyncio.Event()

    async def on_event(event: EngineEvent) -> None:
        events.append(event)
        if event.type == "run.failed":
            ended.set()

    unsubscribe = await gateway.subscribe(wait_id, on_event)
    try:
        cancelled = await gateway.cancel(wait_id)
        assert cancelled is not None
        report["cancelled"] = cancelled.status
        await asyncio.wait_for(ended.wait(), WAIT)
    finally:
        unsubscribe()
    report["events_are_the_runs"] = {e.run_id for e in events} == {wait_id}
    report["event_error"] = events[-1].error.message if events[-1].error else None

    retried = await gateway.retry(fail_id)
    assert retried is not None

    async def failed_again() -> bool:
        run = await gateway.get_run(fail_id)
        return (
            run is not None and run.status == "failed" and run.updated_at > failing.run.updated_at
        )

    report["retried_fails_again"] = await until(failed_again)
    new_id = await gateway.retry_with_input(fail_id, 5)
    assert new_id is not None

    async def replayed() -> durably.WorkflowRun | None:
        run = await gateway.get_run(new_id)
        return run if run is not None and run.status == "completed" else None

    run = await until(replayed)
    report["replay"] = (new_id.startswith(f"{fail_id}~retry~"), run.output, run.namespace)
    return report


def make_workflows(tag: str) -> tuple[list[Any], dict[str, str]]:
    @durably.workflow(f"{tag}.wait")
    async def wait(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.wait_for_signal(f"{tag}:go:{ctx.run_id}")

    @durably.workflow(f"{tag}.fail")
    async def fail(ctx: WorkflowCtx, x: int) -> int:
        if x < 0:
            raise durably.FatalError("negative input", code="negative")
        return x

    return [wait, fail], {"wait": wait.name, "fail": fail.name}


@asynccontextmanager
async def client_over(store: str, _url: str, _prefix: str) -> AsyncIterator[RunGateway]:
    async with durably.Client(store, namespace=TENANT) as client:
        yield client


@asynccontextmanager
async def tenant_over(_store: str, url: str, prefix: str) -> AsyncIterator[RunGateway]:
    async with durably.TenantGateway(url, tenant=TENANT, prefix=prefix) as tenant:
        yield tenant


GATEWAYS: dict[str, Callable[[str, str, str], AbstractAsyncContextManager[RunGateway]]] = {
    "client": client_over,
    "tenant": tenant_over,
}


async def run_controller(
    kind: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> dict[str, Any]:
    tag = f"rg-{kind}-{redis_prefix}"
    workflows, names = make_workflows(tag)
    store = f"sqlite:///{tmp_path / f'{kind}.db'}"
    engine = durably.Engine(
        store,
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=workflows,
        namespace=None,  # an operator engine: it drives every tenant's runs
        timer_poll_ms=50,
    )
    async with engine:
        await engine.start(names["wait"], 1, run_id=f"{tag}-wait", namespace=TENANT)
        await engine.start(names["fail"], -1, run_id=f"{tag}-fail", namespace=TENANT)
        async with GATEWAYS[kind](store, redis_url, redis_prefix) as gateway:
            return await controller(gateway, names)


async def test_one_controller_runs_over_a_client_and_over_a_tenant_gateway(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    over_client = await run_controller("client", redis_url, redis_prefix, tmp_path)
    over_tenant = await run_controller("tenant", redis_url, redis_prefix, tmp_path)
    assert over_client.pop("role") == "control-plane"
    assert over_tenant.pop("role") == "tenant"
    expected = {
        "waiting_on": "signal",
        "failed_code": "negative",
        "detail": (True, "suspended"),
        "get_run": "failed",
        "unknown": None,
        "waiting_for": {f"rg-client-{redis_prefix}-wait": "signal"},
        "facets": [("failed", 1), ("suspended", 1)],
        "values": sorted(
            [(f"rg-client-{redis_prefix}.fail", 1), (f"rg-client-{redis_prefix}.wait", 1)]
        ),
        "health_is_a_list": True,
        "continue": None,
        "redispatched": 0,
        "cancelled": "cancelled",
        "events_are_the_runs": True,
        "event_error": "cancelled",
        "retried_fails_again": True,
        "replay": (True, 5, TENANT),
    }
    assert over_client == expected
    tenant_expected = {
        **expected,
        "waiting_for": {f"rg-tenant-{redis_prefix}-wait": "signal"},
        "values": sorted(
            [(f"rg-tenant-{redis_prefix}.fail", 1), (f"rg-tenant-{redis_prefix}.wait", 1)]
        ),
    }
    assert over_tenant == tenant_expected
