"""StateStore conformance: round-trip counting (`statement_count`) on every store, and the
test hooks only the in-memory store exposes, named `test_memory_*`.
"""

from __future__ import annotations

import pytest

from durably import AttributeFilter, InMemoryStateStore, RunQuery

from .support import ConformantStore, at, attr, make_cp, make_run, seed_attrs

# ================================================================== round trips (statement_count)


async def test_statement_count_counts_round_trips(store: ConformantStore) -> None:
    before = store.statement_count
    await store.create_run(make_run())
    await store.get_run("r1")
    await store.save_checkpoint(make_cp())
    after = store.statement_count
    assert after >= before + 3


# ================================================================== in-memory test hooks


async def test_memory_checkpoint_rows_read_hooks() -> None:
    mem = InMemoryStateStore()
    for seq, name in enumerate(["a", "spawn:1", "b", "spawn:2", "c"]):
        await mem.save_checkpoint(make_cp(seq=seq, name=name))
    assert mem.checkpoint_rows_read == 0 and mem.last_checkpoint_rows_read == 0

    await mem.list_checkpoints("r1")
    assert mem.last_checkpoint_rows_read == 5 and mem.checkpoint_rows_read == 5
    await mem.list_checkpoints_by_name_prefix("r1", ["spawn:"])
    assert mem.last_checkpoint_rows_read == 2 and mem.checkpoint_rows_read == 7
    await mem.get_latest_checkpoint_by_name("r1", "b")
    assert mem.last_checkpoint_rows_read == 1 and mem.checkpoint_rows_read == 8
    await mem.get_latest_checkpoint_by_name("r1", "zzz")
    assert mem.last_checkpoint_rows_read == 0 and mem.checkpoint_rows_read == 8
    await mem.get_checkpoint("r1", 0)  # durably: cumulative only
    assert mem.last_checkpoint_rows_read == 0 and mem.checkpoint_rows_read == 9
    await mem.count_checkpoints("r1", 0, 10, ["completed"])
    assert mem.checkpoint_rows_read == 9
    await mem.list_checkpoints_by_name_prefix("r1", [])
    assert mem.last_checkpoint_rows_read == 0 and mem.checkpoint_rows_read == 9


async def test_memory_last_attribute_candidates() -> None:
    mem = InMemoryStateStore()
    await seed_attrs(mem)
    await mem.list_runs(attr("tier", "eq", "pro"))
    assert mem.last_attribute_candidates == 2
    two = RunQuery(
        attributes=[AttributeFilter("tier", "eq", "pro"), AttributeFilter("amount", "gt", 100)],
    )
    await mem.list_runs(two)
    assert mem.last_attribute_candidates == 1
    # the candidate pass runs before the status filter and paging
    await mem.list_runs(RunQuery(attributes=[AttributeFilter("tier", "ne", "x")], limit=1))
    assert mem.last_attribute_candidates == 4
    await mem.count_runs(attr("missing", "eq", 1))
    assert mem.last_attribute_candidates == 0


async def test_memory_statement_count_is_one_per_call() -> None:
    mem = InMemoryStateStore()
    await mem.create_run(make_run())
    await mem.get_run("r1")
    await mem.list_runs(RunQuery())
    await mem.save_checkpoints_if_pending([make_cp()])
    assert mem.statement_count == 4


async def test_memory_update_run_uses_clock_and_rejects_unknown_keys() -> None:
    mem = InMemoryStateStore(clock=lambda: at(60, ms=7))
    await mem.create_run(make_run())
    await mem.update_run("r1", {"status": "completed"})
    run = await mem.get_run("r1")
    assert run is not None and run.updated_at == at(60, ms=7)
    with pytest.raises(ValueError, match="unknown RunPatch key"):
        await mem.update_run("r1", {"awaitingDecisionTaskId": None})  # type: ignore[typeddict-unknown-key]
