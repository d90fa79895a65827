"""Checked by `mypy --strict` in test_gateway_typing.py: `Client`, `Engine` and
`TenantGateway` are each a `RunGateway`, and code written against the Protocol type-checks
with the concrete types' answers."""

from __future__ import annotations

from typing import assert_type

from durably import (
    Client,
    Engine,
    EngineEvent,
    RunDetail,
    RunGateway,
    RunWaiting,
    TenantGateway,
    WorkflowRun,
)


def conforms(client: Client, engine: Engine, tenant: TenantGateway) -> list[RunGateway]:
    from_client: RunGateway = client
    from_engine: RunGateway = engine
    from_tenant: RunGateway = tenant
    return [from_client, from_engine, from_tenant]


async def controller(gateway: RunGateway, run_id: str) -> None:
    assert_type(gateway.topology(), dict[str, str])
    assert_type(await gateway.get_run(run_id), WorkflowRun | None)
    assert_type(await gateway.get_run_detail(run_id, summarize_fans_over=10), RunDetail | None)
    items = await gateway.list_run_items(workflow="orders", limit=20)
    for item in items:
        assert_type(item.waiting, RunWaiting | None)

    async def on_event(event: EngineEvent) -> None:
        assert_type(event.run_id, str)

    unsubscribe = await gateway.subscribe(run_id, on_event)
    unsubscribe()
    await gateway.cancel(run_id, compensate=True)
