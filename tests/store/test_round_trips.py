"""The first-party stores' round-trip counters (`statement_count`, and the in-memory store's
`checkpoint_rows_read` / `checkpoint_stats_rows_read`) on memory, SQLite and PostgreSQL: how
many statements a call costs and how many rows it reads. A third-party store keeps no such
counters, so these stay out of the importable suite (`durably.testing.conformance`).

Each test takes the parametrized `store` fixture of conftest.py.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from durably import AttributeFilter, InMemoryStateStore, RunQuery, SignalWaiter
from durably._core.aggregates import CheckpointQuery
from durably._core.models import ChildWait
from durably._store.protocol import BULK_CHUNK
from durably.testing.conformance.state_store.aggregates import STEP_FAN, by_key, seed
from tests.store.support import T0, ConformantStore, at, attr, make_cp, make_run, seed_attrs

WIDE = 40_000


WIDE_STEPS = "all:0:30000"


WIDE_CHILDREN = "all:30000:10000"


def wide_row(seq: int) -> ChildWait:
    """Members of two fans of one run: 30 000 steps (every 7th failed, every 11th pending),
    then 10 000 children (completed, every 13th running)."""
    when = at(seq // 1000, ms=seq % 1000)
    if seq < 30_000:
        status = "failed" if seq % 7 == 0 else "pending" if seq % 11 == 0 else "completed"
        row = make_cp(
            "wide", seq, name="work", status=status, output=None,
            parallel_group=WIDE_STEPS, started_at=when, finished_at=when, enqueued_at=when,
        )  # fmt: skip
    else:
        status = "running" if seq % 13 == 0 else "completed"
        row = make_cp(
            "wide", seq, name=f"signal:child:wide.all.30000.{seq - 30_000}", kind="signal",
            status=status, output=None, parallel_group=WIDE_CHILDREN,
            started_at=when, finished_at=when, enqueued_at=when,
        )  # fmt: skip
    return ChildWait(SignalWaiter(f"wide:{seq}", "wide", seq), row)


def wide_expected() -> Counter[tuple[str, str, str]]:
    out: Counter[tuple[str, str, str]] = Counter()
    for seq in range(WIDE):
        row = wide_row(seq).placeholder
        assert row is not None and row.parallel_group is not None
        kind = "child" if row.name.startswith("signal:child:") else "step"
        out[(row.parallel_group, row.status, kind)] += 1
    return out


async def test_statement_count_counts_round_trips(store: ConformantStore) -> None:
    before = store.statement_count
    await store.create_run(make_run())
    await store.get_run("r1")
    await store.save_checkpoint(make_cp())
    after = store.statement_count
    assert after >= before + 3


async def test_save_checkpoints_upserts_every_row_in_a_few_statements(
    store: ConformantStore,
) -> None:
    await store.save_checkpoint(make_cp(seq=0, status="pending", output=None))
    before = store.statement_count
    await store.save_checkpoints(
        [make_cp("r9", seq, output={"v": seq}) for seq in range(50)]
        + [make_cp(seq=0, output={"replaced": True})]
    )
    # one executemany (per chunk) inside one transaction, not one write per row
    assert store.statement_count - before < 5
    rows = await store.list_checkpoints("r9")
    assert [(c.seq, c.output) for c in rows] == [(s, {"v": s}) for s in range(50)]
    (first,) = await store.list_checkpoints("r1")
    assert first.status == "completed" and first.output == {"replaced": True}
    await store.save_checkpoints([])


async def test_create_runs_at_scale_costs_statements_per_chunk(store: Any) -> None:
    n = BULK_CHUNK * 2 + 5
    runs = [make_run(f"k{i:05d}", status="pending", created_at=T0) for i in range(n)]
    before = store.statement_count
    assert await store.create_runs(runs) == [None] * n
    # lookups + inserts, one per chunk each (3 chunks): never one per run
    assert store.statement_count - before <= 6
    assert len(await store.list_runs(RunQuery(status="pending"))) == n


async def test_checkpoint_stats_read_no_checkpoint_rows(store: Any) -> None:
    """Stats return no rows (the counter does not move); one statement; what
    comes back is one row per bucket."""
    await seed(store)
    rows_before, statements = store.checkpoint_rows_read, store.statement_count
    buckets_before = store.checkpoint_stats_rows_read
    stats = await store.checkpoint_stats("r1")
    assert store.checkpoint_rows_read == rows_before
    assert store.statement_count - statements == 1
    assert store.checkpoint_stats_rows_read - buckets_before == len(stats)
    await store.checkpoint_stats("r1", group=STEP_FAN)
    assert store.checkpoint_rows_read == rows_before
    assert store.statement_count - statements == 2


async def test_query_checkpoints_count_rows_read(store: Any) -> None:
    """Every returned row is counted (cumulative and last)."""
    await seed(store)
    before = store.checkpoint_rows_read
    got = await store.query_checkpoints("r1", CheckpointQuery(group=STEP_FAN, limit=3))
    assert len(got) == 3
    assert store.checkpoint_rows_read - before == 3
    assert store.last_checkpoint_rows_read == 3
    await store.query_checkpoints("r1", CheckpointQuery(statuses=[]))
    assert store.checkpoint_rows_read - before == 3
    assert store.last_checkpoint_rows_read == 0


async def test_checkpoint_stats_of_a_40000_row_run_read_a_few_rows(store: Any) -> None:
    await store.create_run(make_run("wide"))
    waits = [wide_row(seq) for seq in range(WIDE)]
    began = time.perf_counter()
    await store.register_child_waits(waits)  # the bulk path: 1 000 rows per statement
    seeded = time.perf_counter() - began

    rows_before, statements = store.checkpoint_rows_read, store.statement_count
    buckets_before = store.checkpoint_stats_rows_read
    stats = await store.checkpoint_stats("wide")
    assert store.statement_count - statements == 1
    assert store.checkpoint_rows_read == rows_before
    assert store.checkpoint_stats_rows_read - buckets_before == len(stats) == 5
    assert {s.key: s.count for s in stats} == dict(wide_expected())
    steps_failed = by_key(stats)[(WIDE_STEPS, "failed", "step")]
    assert (steps_failed.min_seq, steps_failed.max_seq) == (0, 29_995)
    assert steps_failed.min_name == steps_failed.max_name == "work"
    done = by_key(stats)[(WIDE_CHILDREN, "completed", "child")]
    assert done.max_finished_at == at(39, ms=999)
    assert done.min_enqueued_at == at(30, ms=0)

    # one group's stats, and a page of its failures: only the page's rows are read
    group_stats = await store.checkpoint_stats("wide", group=WIDE_STEPS)
    assert {s.key for s in group_stats} == {k for k in dict(wide_expected()) if k[0] == WIDE_STEPS}
    page = await store.query_checkpoints(
        "wide", CheckpointQuery(group=WIDE_STEPS, statuses=["failed"], offset=100, limit=20)
    )
    assert [row.seq for row in page] == list(range(700, 840, 7))
    assert store.checkpoint_rows_read - rows_before == 20
    timeline = await store.query_checkpoints(
        "wide", CheckpointQuery(exclude_groups=[WIDE_STEPS, WIDE_CHILDREN])
    )
    assert timeline == []
    assert store.checkpoint_rows_read - rows_before == 20
    assert seeded < 15, f"seeding 40 000 rows took {seeded:.1f}s"


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
