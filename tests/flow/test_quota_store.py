"""The store's side of workflow start admission, on every store: gated starts
(`create_run_gated`), singleton admission (`try_admit_singleton`) and wake-ups
(`wake_singleton_waiters`), each one transaction. Memory, SQLite (a real file) and
PostgreSQL (a fresh schema) must give the same answers; the codec wrapper forwards them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from durably import InMemoryStateStore, StateStore, WorkflowRun
from durably._core.models import now_utc
from durably._core.quota import SINGLETON_ADMITTED_TAG, StartGate
from durably._store.codec import wrap_store
from tests.sql.conftest import open_store
from tests.store.support import try_lock

T0 = now_utc()


class _Rot13:
    """A codec that changes every payload (so a payload that bypassed it would show)."""

    def encode(self, value: Any) -> Any:
        return {"enc": value}

    def decode(self, value: Any) -> Any:
        return value["enc"] if isinstance(value, dict) and "enc" in value else value


@pytest.fixture(params=["memory", "sqlite", "postgres", "codec"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StateStore]:
    if request.param in ("memory", "codec"):
        made: StateStore = InMemoryStateStore()
        yield made if request.param == "memory" else wrap_store(made, _Rot13())
        return
    async with open_store(str(request.param), tmp_path / "q.db") as sql:
        yield sql


def run(
    run_id: str,
    *,
    workflow: str = "wf",
    tags: tuple[str, ...] = (),
    status: Any = "pending",
    at: int = 0,
) -> WorkflowRun:
    created = T0 + timedelta(milliseconds=at)
    return WorkflowRun(
        id=run_id,
        workflow=workflow,
        workflow_version="1",
        status=status,
        input={"n": run_id},
        tags=tags or None,
        created_at=created,
        updated_at=created,
    )


async def test_a_gated_start_inserts_once_and_answers_an_existing_id(store: StateStore) -> None:
    gate = StartGate(quota_tag="concurrency:k", quota_limit=5)
    created = await store.create_run_gated(run("a", tags=("concurrency:k",)), gate)
    assert created.verdict == "created"
    again = await store.create_run_gated(run("a", workflow="other"), gate)
    assert (again.verdict, again.holder) == ("exists", "wf")
    stored = await store.get_run("a")
    assert stored is not None and stored.input == {"n": "a"} and stored.tags == ("concurrency:k",)


async def test_a_quota_counts_tagged_runs_in_its_statuses(store: StateStore) -> None:
    tag = "concurrency:cust"
    gate = StartGate(quota_tag=tag, quota_limit=2)
    assert (await store.create_run_gated(run("q1", tags=(tag,)), gate)).verdict == "created"
    assert (
        await store.create_run_gated(run("q2", workflow="another", tags=(tag,)), gate)
    ).verdict == "created"  # the key is shared by every workflow
    full = await store.create_run_gated(run("q3", tags=(tag,)), gate)
    assert (full.verdict, full.active) == ("quota_full", 2)
    assert await store.get_run("q3") is None
    # only the counted statuses take a slot
    await store.update_run("q1", {"status": "suspended"})
    narrow = StartGate(quota_tag=tag, quota_limit=2, quota_statuses=("pending", "running"))
    assert (await store.create_run_gated(run("q3", tags=(tag,)), narrow)).verdict == "created"
    # a finished run frees its slot
    await store.update_run("q2", {"status": "completed"})
    assert (await store.create_run_gated(run("q4", tags=(tag,)), gate)).verdict == "quota_full"
    await store.update_run("q1", {"status": "failed"})
    assert (await store.create_run_gated(run("q4", tags=(tag,)), gate)).verdict == "created"
    zero = await store.create_run_gated(run("q5"), StartGate(quota_tag=tag, quota_limit=0))
    assert (zero.verdict, zero.active) == ("quota_full", 0)


async def test_a_dedup_key_is_held_while_its_run_is_live(store: StateStore) -> None:
    gate = StartGate(dedup_key="order-1")
    assert (await store.create_run_gated(run("d1"), gate)).verdict == "created"
    dup = await store.create_run_gated(run("d2"), gate)
    assert (dup.verdict, dup.holder) == ("duplicate", "d1")
    assert await store.get_run("d2") is None
    await store.update_run("d1", {"status": "cancelled"})
    assert (await store.create_run_gated(run("d2"), gate)).verdict == "created"
    assert (await store.create_run_gated(run("d3"), gate)).holder == "d2"
    await store.delete_run("d2")  # a deleted holder frees the key too
    assert (await store.create_run_gated(run("d3"), gate)).verdict == "created"


async def test_singleton_back_pressure_counts_active_runs_of_the_workflow(
    store: StateStore,
) -> None:
    tag = "singleton:k"
    gate = StartGate(singleton_tag=tag, singleton_workflow="wf", singleton_capacity=2)
    for rid in ("s1", "s2"):
        assert (await store.create_run_gated(run(rid, tags=(tag,)), gate)).verdict == "created"
    full = await store.create_run_gated(run("s3", tags=(tag,)), gate)
    assert (full.verdict, full.active) == ("singleton_full", 2)
    # another workflow's runs with the same tag are another line
    other = StartGate(singleton_tag=tag, singleton_workflow="wf2", singleton_capacity=2)
    assert (
        await store.create_run_gated(run("o1", workflow="wf2", tags=(tag,)), other)
    ).verdict == "created"
    await store.update_run("s1", {"status": "dead"})
    assert (await store.create_run_gated(run("s3", tags=(tag,)), gate)).verdict == "created"


async def test_singleton_admission_in_creation_order(store: StateStore) -> None:
    tag = "singleton:k"
    for i, rid in enumerate(("w1", "w2", "w3")):
        await store.create_run(run(rid, tags=(tag,), at=i))
    # the youngest asks first: denied, parked suspended with the retry wake, lease dropped
    await try_lock(store, "w3", "me", 10**13, 0)
    assert not await store.try_admit_singleton("w3", tag, "wf", 1, 123)
    parked = await store.get_run("w3")
    assert parked is not None
    assert (parked.status, parked.wake_at, parked.locked_by) == ("suspended", 123, None)
    assert SINGLETON_ADMITTED_TAG not in (parked.tags or ())
    assert await store.try_admit_singleton("w1", tag, "wf", 1, 123)
    assert await store.try_admit_singleton("w1", tag, "wf", 1, 123)  # a holder stays one
    held = await store.get_run("w1")
    assert held is not None and held.tags == (tag, SINGLETON_ADMITTED_TAG)
    assert not await store.try_admit_singleton("w2", tag, "wf", 1, 456)
    # with two slots the next in line is admitted, the one after it still waits
    assert await store.try_admit_singleton("w2", tag, "wf", 2, 456)
    assert not await store.try_admit_singleton("w3", tag, "wf", 2, 789)
    # the holder finishes: the next waiter (w3) is woken, made due now
    await store.update_run("w1", {"status": "completed"})
    assert await store.wake_singleton_waiters(tag, "wf", 2, 42) == ["w3"]
    woken = await store.get_run("w3")
    assert woken is not None and woken.wake_at == 42
    assert await store.wake_singleton_waiters(tag, "wf", 1, 42) == []  # w2 holds the slot


async def test_admission_never_revives_a_cancelled_or_finished_run(store: StateStore) -> None:
    tag = "singleton:k"
    await store.create_run(run("h", tags=(tag, SINGLETON_ADMITTED_TAG), status="running"))
    await store.create_run(run("c", tags=(tag,), status="cancelling", at=1))
    await store.create_run(run("x", tags=(tag,), status="cancelled", at=2))
    assert not await store.try_admit_singleton("c", tag, "wf", 1, 99)
    cancelling = await store.get_run("c")
    assert cancelling is not None and cancelling.status == "cancelling"
    assert not await store.try_admit_singleton("x", tag, "wf", 5, 99)
    done = await store.get_run("x")
    assert done is not None and done.status == "cancelled" and done.wake_at is None
    assert not await store.try_admit_singleton("missing", tag, "wf", 5, 99)


async def test_a_run_without_its_tag_joins_the_line_at_admission(store: StateStore) -> None:
    tag = "singleton:late"
    await store.create_run(run("t1", tags=("mine",)))
    assert await store.try_admit_singleton("t1", tag, "wf", 1, 5)
    got = await store.get_run("t1")
    assert got is not None and got.tags == ("mine", tag, SINGLETON_ADMITTED_TAG)
    await store.create_run(run("t2", at=1))
    assert not await store.try_admit_singleton("t2", tag, "wf", 1, 5)
    second = await store.get_run("t2")
    assert second is not None and second.tags == (tag,)
    assert await store.wake_singleton_waiters(tag, "wf", 2, 7) == ["t2"]


async def test_concurrent_gated_starts_pass_one_at_a_time(store: StateStore) -> None:
    """Many starts of one quota key at once (on PostgreSQL each in its own transaction on
    its own connection): exactly `limit` get in."""
    tag = "concurrency:race"
    gate = StartGate(quota_tag=tag, quota_limit=3, dedup_key=None)
    outcomes = await asyncio.gather(
        *(store.create_run_gated(run(f"r{i}", tags=(tag,)), gate) for i in range(12))
    )
    assert sum(o.verdict == "created" for o in outcomes) == 3
    dedup = StartGate(dedup_key=f"k-{uuid.uuid4().hex}")
    outcomes = await asyncio.gather(
        *(store.create_run_gated(run(f"u{i}"), dedup) for i in range(8))
    )
    created = [o for o in outcomes if o.verdict == "created"]
    assert len(created) == 1
    holders = {o.holder for o in outcomes if o.verdict == "duplicate"}
    assert len(holders) == 1 and len(outcomes) - len(created) == 7


async def test_concurrent_singleton_starts_and_admissions_pass_one_at_a_time(
    store: StateStore,
) -> None:
    """Back-pressure and admission under a race: of many starts of a key with room for two,
    two get in; of the runs of a key asking for its one slot at once, one is admitted and
    every other is parked."""
    tag = "singleton:race"
    gate = StartGate(singleton_tag=tag, singleton_workflow="wf", singleton_capacity=2)
    outcomes = await asyncio.gather(
        *(store.create_run_gated(run(f"b{i}", tags=(tag,), at=i), gate) for i in range(10))
    )
    assert sum(o.verdict == "created" for o in outcomes) == 2
    line = "singleton:line"
    for i in range(8):
        await store.create_run(run(f"l{i}", tags=(line,), at=i))
    admitted = await asyncio.gather(
        *(store.try_admit_singleton(f"l{i}", line, "wf", 1, 5) for i in range(8))
    )
    assert admitted == [True] + [False] * 7
    statuses = [(await store.get_run(f"l{i}")) for i in range(8)]
    assert [r.status for r in statuses if r is not None] == ["pending"] + ["suspended"] * 7
