"""A run id is unique across namespaces: a start whose id another namespace's run holds is a
`RunIdConflictError`, on every start path (Engine.start, Client.start, signal_with_start,
dedup and quota-gated starts, a child with a given id), on memory, SQLite and PostgreSQL.

The squatting these tests pin down: a tenant `evil` started `invoice-42` and `op-job-7`
first; `acme`'s start of `invoice-42` then did nothing (and its reads answered
`cross-tenant`), and the operator's `engine.start(charge, run_id="op-job-7")` returned evil's
run — its namespace, its output. Only the same id in the same namespace for the same
workflow is an idempotent start that returns the existing run.

Also here: text a store cannot hold (a NUL in a tag, a search attribute or the workflow name)
is refused with a `PayloadRejectedError` (a `ValueError`) on every store, before anything is
written, instead of a driver error on PostgreSQL only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

import durably
from durably import Client, Engine, RunIdConflictError
from tests.client.conftest import FAST

WAIT = 20.0


@asynccontextmanager
async def operator_and_evil(
    store: Any, *workflows: durably.Workflow[Any, Any]
) -> AsyncIterator[tuple[Engine, Client, Client]]:
    """The operator's engine (default namespace), and clients of tenants `evil` and `acme`."""
    async with Engine(store=store, workflows=workflows, **FAST) as engine:
        async with Client(store, namespace="evil") as evil, Client(store, namespace="acme") as acme:
            yield engine, evil, acme


def charge_workflow(uid: str) -> durably.Workflow[Any, Any]:
    @durably.workflow(f"{uid}-charge")
    async def charge(ctx: durably.WorkflowCtx, amount: int) -> dict[str, Any]:
        return {"charged": amount, "namespace": "operator"}

    return charge


async def test_a_tenant_cannot_take_another_tenants_run_id(store: Any, uid: str) -> None:
    charge = charge_workflow(uid)
    async with operator_and_evil(store, charge) as (_, evil, acme):
        await evil.start(charge.name, 1, run_id=f"{uid}-invoice-42")
        with pytest.raises(RunIdConflictError, match="another namespace") as caught:
            await acme.start(charge.name, 100, run_id=f"{uid}-invoice-42")
        # The refusal names neither the other namespace nor its workflow.
        assert "evil" not in str(caught.value)
        run = await acme.get_run(f"{uid}-invoice-42")
        assert run is not None and run.namespace == "evil" and run.input == 1


async def test_the_operators_start_never_returns_a_tenants_run(store: Any, uid: str) -> None:
    charge = charge_workflow(uid)
    async with operator_and_evil(store, charge) as (engine, evil, _):
        await evil.start(charge.name, 666, run_id=f"{uid}-op-job-7")
        with pytest.raises(RunIdConflictError):
            await engine.start(charge, 5, run_id=f"{uid}-op-job-7")
        with pytest.raises(RunIdConflictError):  # the same through a dedup-gated start
            await engine.start(charge, 5, run_id=f"{uid}-op-job-7", dedup_id="d1")
        with pytest.raises(RunIdConflictError):  # and a quota-gated one
            await engine.start(
                charge,
                5,
                run_id=f"{uid}-op-job-7",
                concurrency=durably.ConcurrencyQuota("k", 10),
            )
        with pytest.raises(RunIdConflictError):  # and a start by name
            await engine.start(charge.name, 5, run_id=f"{uid}-op-job-7")
        run = await engine.get_run(f"{uid}-op-job-7")
        assert run is not None and run.namespace == "evil" and run.input == 666


async def test_signal_with_start_does_not_signal_another_namespaces_run(
    store: Any, uid: str
) -> None:
    @durably.workflow(f"{uid}-waiter")
    async def waiter(ctx: durably.WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(f"{uid}:go")

    async with operator_and_evil(store, waiter) as (_, evil, acme):
        await evil.start(waiter.name, run_id=f"{uid}-w")
        with pytest.raises(RunIdConflictError):
            await acme.signal_with_start(waiter.name, run_id=f"{uid}-w", token=f"{uid}:go")
        assert await evil.list_buffered_signals(prefix=f"{uid}:go") == []


async def test_the_idempotent_start_still_returns_the_existing_run(store: Any, uid: str) -> None:
    charge = charge_workflow(uid)
    async with operator_and_evil(store, charge) as (engine, evil, _):
        first = await evil.start(charge.name, 1, run_id=f"{uid}-same")
        again = await evil.start(charge.name, 2, run_id=f"{uid}-same")
        gated = await evil.start(charge.name, 3, run_id=f"{uid}-same", dedup_id="d")
        assert first.run_id == again.run_id == gated.run_id == f"{uid}-same"
        run = await evil.get_run(f"{uid}-same")
        assert run is not None and run.input == 1 and run.namespace == "evil"
        # The operator's own id, started twice in its own namespace, is one run.
        a = await engine.start(charge, 9, run_id=f"{uid}-mine")
        b = await engine.start(charge, 9, run_id=f"{uid}-mine")
        assert a.run_id == b.run_id
        assert await a.result(timeout=WAIT) == {"charged": 9, "namespace": "operator"}


async def test_a_child_with_a_given_id_is_not_another_namespaces_run(store: Any, uid: str) -> None:
    charge = charge_workflow(uid)

    @durably.workflow(f"{uid}-parent")
    async def parent(ctx: durably.WorkflowCtx) -> Any:
        try:
            return await ctx.child(charge, 7, id=f"{uid}-squatted")
        except durably.FatalError as exc:
            return {"refused": str(exc)}

    async with operator_and_evil(store, charge, parent) as (engine, evil, _):
        squat = await evil.start(charge.name, 666, run_id=f"{uid}-squatted")
        assert squat.run_id == f"{uid}-squatted"
        handle = await engine.start(parent, run_id=f"{uid}-p")
        outcome = await handle.result(timeout=WAIT)
        assert isinstance(outcome, dict) and "refused" in outcome, outcome
        assert "another namespace" in outcome["refused"]


# ---------------------------------------------------------------------------- text


NUL_STARTS = [
    pytest.param({"tags": ["ok", "bad\x00tag"]}, "run tag", id="tag"),
    pytest.param({"search_attributes": {"customer": "a\x00b"}}, "search attribute", id="value"),
    pytest.param({"search_attributes": {"cu\x00st": "x"}}, "search attribute name", id="key"),
]


@pytest.mark.parametrize(("options", "what"), NUL_STARTS)
async def test_a_nul_in_a_tag_or_attribute_is_refused_on_every_store(
    store: Any, uid: str, options: dict[str, Any], what: str
) -> None:
    charge = charge_workflow(uid)
    async with operator_and_evil(store, charge) as (engine, _, acme):
        with pytest.raises(ValueError, match=what) as caught:
            await engine.start(charge, 1, run_id=f"{uid}-e", **options)
        assert isinstance(caught.value, durably.PayloadRejectedError)
        with pytest.raises(ValueError, match=what):
            await acme.start(charge.name, 1, run_id=f"{uid}-c", **options)
        assert await engine.get_run(f"{uid}-e") is None
        assert await engine.get_run(f"{uid}-c") is None


async def test_a_nul_in_the_workflow_name_is_refused_on_every_store(store: Any, uid: str) -> None:
    async with operator_and_evil(store) as (_, _evil, acme):
        with pytest.raises(ValueError, match="workflow name"):
            await acme.start(f"{uid}-bad\x00name", 1, run_id=f"{uid}-n")
        assert await acme.get_run(f"{uid}-n") is None
        # The client still works after the refusal.
        await acme.start(f"{uid}-fine", 1, run_id=f"{uid}-fine")
        assert await acme.get_run(f"{uid}-fine") is not None
