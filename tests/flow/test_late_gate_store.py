"""`StateStore.gate_untagged_run`: the first-turn check of a run started by name without the
workflow's code, on every store (memory, SQLite, PostgreSQL, behind a codec): the same
capacity a gated start checks, the tags added in the same transaction, and under a race of
workers taking runs of one key at once, only as many pass as the limit allows."""

from __future__ import annotations

import asyncio

from durably import StateStore
from durably._core.quota import StartGate
from tests.flow.test_quota_store import run, store  # noqa: F401  (the fixture)


async def test_untagged_runs_pass_their_quota_at_the_first_turn(store: StateStore) -> None:  # noqa: F811
    tag = "concurrency:k"
    gate = StartGate(quota_tag=tag, quota_limit=2)
    for i in range(6):
        await store.create_run(run(f"u{i}", at=i))  # created without the tag
    outcomes = await asyncio.gather(
        *(store.gate_untagged_run(f"u{i}", [tag], gate) for i in range(6))
    )
    passed = [i for i, o in enumerate(outcomes) if o.verdict == "created"]
    assert len(passed) == 2
    assert {o.verdict for i, o in enumerate(outcomes) if i not in passed} == {"quota_full"}
    for i in range(6):
        found = await store.get_run(f"u{i}")
        assert found is not None
        assert (found.tags or ()) == ((tag,) if i in passed else ())
    # A run no longer pending (settled, or taken and tagged) is left alone.
    await store.update_run("u0", {"status": "cancelled"})
    assert (await store.gate_untagged_run("u0", [tag], gate)).verdict == "exists"
    assert (await store.gate_untagged_run("missing", [tag], gate)).verdict == "exists"


async def test_untagged_singleton_runs_pass_the_queue_depth(store: StateStore) -> None:  # noqa: F811
    tag = "singleton:acct"
    gate = StartGate(singleton_tag=tag, singleton_workflow="wf", singleton_capacity=2)
    await store.create_run(run("held", tags=(tag,), at=0))
    for i in range(4):
        await store.create_run(run(f"w{i}", at=1 + i))
    outcomes = [await store.gate_untagged_run(f"w{i}", [tag], gate) for i in range(4)]
    assert [o.verdict for o in outcomes] == ["created"] + ["singleton_full"] * 3
    assert outcomes[1].active == 2
