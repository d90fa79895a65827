"""StateStore conformance: checkpoint aggregates (`checkpoint_stats`, `query_checkpoints`),
the in-memory store's read counters and the shared reference helpers.

Every store must give the in-memory reference answers: `checkpoint_stats` equals
`checkpoint_stats_of(list_checkpoints(run))` (compared as sorted lists), `query_checkpoints`
equals `query_checkpoints_of(list_checkpoints(run), q)`. The stats are one statement that
sends back one row per bucket (`checkpoint_stats_rows_read`), never the run's checkpoints
(`checkpoint_rows_read` does not move), proven on a 40 000-row run.

Each test takes the parametrized `store` fixture (see conftest.py).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa

from durably import SignalWaiter, StepCheckpoint, StepError
from durably._core.aggregates import (
    CheckpointQuery,
    CheckpointStat,
    checkpoint_stats_of,
    query_checkpoints_of,
    stat_sort_key,
)
from durably._core.models import HANDOFF_SEQ_BASE, ChildWait, replace

from .support import at, make_cp, make_run

# ------------------------------------------------------------------ a hand-built timeline

STEP_FAN = "all:2:5"  # declared step fan, mixed statuses
NAMES_FAN = "all:7"  # undeclared step fan, members with different names
CHILD_FAN = "all:10:9"  # child fan: placeholders, completions (one ok:false), folded waves
GATHER = "gather:30"  # a one-member group


def cp(seq: int, name: str, **kw: Any) -> StepCheckpoint:
    minute = seq % 50
    fields: dict[str, Any] = {
        "started_at": at(minute, ms=seq),
        "finished_at": at(minute + 1, ms=seq),
        "enqueued_at": at(minute, ms=-seq),
    }
    fields.update(kw)
    return make_cp("r1", seq, name=name, **fields)


def child(
    seq: int, child_id: str, status: str, ok: bool | None = None, **kw: Any
) -> StepCheckpoint:
    output = (
        None
        if ok is None
        else (
            {"ok": True, "value": seq} if ok else {"ok": False, "error": "boom", "code": "declined"}
        )
    )
    return cp(seq, f"signal:child:{child_id}", kind="signal", status=status, output=output, **kw)


def folded(seq: int, prefix: str, first: int, oks: list[bool], **kw: Any) -> StepCheckpoint:
    completions = [
        {"ok": True, "value": i} if ok else {"ok": False, "error": "boom", "details": {"i": i}}
        for i, ok in enumerate(oks)
    ]
    out = {"first": first, "count": len(oks), "completions": completions}
    return cp(seq, f"fan:{prefix}", kind="signal", status="completed", output=out, **kw)


def timeline() -> list[StepCheckpoint]:
    err = StepError("card declined", code="declined", details=[{"field": "cvc"}])
    return [
        # ungrouped steps
        cp(0, "reserve"),
        cp(1, "charge", status="failed", output=None, error=err, attempts=3),
        # a step fan with completed / failed / pending / running members
        cp(2, "ship", parallel_group=STEP_FAN, attempts=2),
        cp(3, "ship", parallel_group=STEP_FAN),
        cp(4, "ship", parallel_group=STEP_FAN, status="failed", output=None, error=err),
        cp(5, "ship", parallel_group=STEP_FAN, status="pending", output=None, kind="remote"),
        cp(6, "ship", parallel_group=STEP_FAN, status="running", output=None),
        # a step fan whose member names differ (min/max name by code point)
        cp(7, "step-b", parallel_group=NAMES_FAN),
        cp(8, "stepa", parallel_group=NAMES_FAN),
        cp(9, "Zeta", parallel_group=NAMES_FAN),
        # a child fan in flight: one folded wave, completions, a failed child, a placeholder
        folded(10, "r1.all.10.w0", 0, [True, False, True], parallel_group=CHILD_FAN),
        folded(13, "r1.all.10.w1", 3, [True, True], parallel_group=CHILD_FAN),
        child(15, "r1.all.10.w2.5", "completed", ok=True, parallel_group=CHILD_FAN),
        child(16, "r1.all.10.w2.6", "completed", ok=False, parallel_group=CHILD_FAN),
        child(17, "r1.all.10.w2.7", "running", parallel_group=CHILD_FAN),
        child(18, "r1.all.10.w2.8", "completed", ok=True, parallel_group=CHILD_FAN),
        # fire-and-forget children and a lone awaited child (ungrouped)
        cp(20, "spawn:x", kind="local", output="x"),
        cp(21, "spawn:y", kind="local", output=None),
        child(22, "solo", "completed", ok=False),
        # case-sensitive kinds: these are steps
        cp(23, "Fan:x"),
        cp(24, "signal:Child:x"),
        cp(25, "event:progress", output={"pct": 50}),
        cp(30, "py.step", parallel_group=GATHER, kind="remote"),
        # an onError handoff checkpoint
        cp(HANDOFF_SEQ_BASE + 1, "handoff:compensate"),
    ]


async def seed(store: Any, run_id: str = "r1") -> list[StepCheckpoint]:
    await store.create_run(make_run(run_id))
    rows = [replace(row, run_id=run_id, step_id=f"{run_id}:{row.seq}") for row in timeline()]
    for row in rows:
        await store.save_checkpoint(row)
    # another run's rows never leak in
    if run_id == "r1":
        await store.create_run(make_run("r2"))
        for row in rows[:12]:
            await store.save_checkpoint(replace(row, run_id="r2", status="failed"))
    return rows


def sorted_stats(stats: list[CheckpointStat]) -> list[CheckpointStat]:
    return sorted(stats, key=stat_sort_key)


def by_key(stats: list[CheckpointStat]) -> dict[tuple[str | None, str, str], CheckpointStat]:
    out = {s.key: s for s in stats}
    assert len(out) == len(stats), "bucket keys must be distinct"
    return out


# ------------------------------------------------------------------ presence


async def test_aggregates_are_present_and_paired(store: Any) -> None:
    assert callable(store.checkpoint_stats) and callable(store.query_checkpoints)


# ------------------------------------------------------------------ checkpoint_stats


async def test_checkpoint_stats_equal_the_reference(store: Any) -> None:
    await seed(store)
    reference = checkpoint_stats_of(await store.list_checkpoints("r1"))
    stats = await store.checkpoint_stats("r1")
    assert sorted_stats(stats) == sorted_stats(reference)
    assert [s.min_seq for s in stats] == sorted(s.min_seq for s in stats)  # by first seq

    b = by_key(stats)
    ship = b[(STEP_FAN, "completed", "step")]
    assert (ship.count, ship.min_seq, ship.max_seq, ship.sum_attempts) == (2, 2, 3, 3)
    assert ship.min_name == ship.max_name == "ship"
    assert ship.min_enqueued_at == at(2, ms=-2)
    assert (ship.min_started_at, ship.max_started_at) == (at(2, ms=2), at(3, ms=3))
    assert ship.max_finished_at == at(4, ms=3)
    for status in ("failed", "pending", "running"):
        assert b[(STEP_FAN, status, "step")].count == 1
    names = b[(NAMES_FAN, "completed", "step")]
    assert (names.count, names.min_name, names.max_name) == (3, "Zeta", "stepa")  # code points
    # the child fan: folded rows are one row each; completed children (ok or not) one bucket
    assert b[(CHILD_FAN, "completed", "folded")].count == 2
    assert b[(CHILD_FAN, "completed", "child")].count == 3
    assert b[(CHILD_FAN, "running", "child")].count == 1
    # ungrouped rows: group None
    assert b[(None, "completed", "spawn")].count == 2
    assert b[(None, "completed", "child")].count == 1
    ungrouped_steps = b[(None, "completed", "step")]
    assert ungrouped_steps.count == 5  # reserve, Fan:x, signal:Child:x, event:, handoff
    assert ungrouped_steps.max_seq == HANDOFF_SEQ_BASE + 1
    assert b[(None, "failed", "step")].sum_attempts == 3
    assert b[(GATHER, "completed", "step")].count == 1
    assert sum(s.count for s in stats) == len(timeline())
    assert {s.name_kind for s in stats} == {"child", "folded", "spawn", "step"}


async def test_checkpoint_stats_json_form(store: Any) -> None:
    await seed(store)
    stat = by_key(await store.checkpoint_stats("r1"))[(STEP_FAN, "completed", "step")]
    data = stat.to_json()
    assert set(data) == {
        "group",
        "status",
        "nameKind",
        "count",
        "minSeq",
        "maxSeq",
        "minName",
        "maxName",
        "minEnqueuedAt",
        "minStartedAt",
        "maxStartedAt",
        "maxFinishedAt",
        "sumAttempts",
    }
    assert data["nameKind"] == "step" and data["minStartedAt"] == "2026-06-11T00:02:00.002000Z"
    assert CheckpointStat.from_json(data) == stat


async def test_checkpoint_stats_group_narrows(store: Any) -> None:
    await seed(store)
    rows = await store.list_checkpoints("r1")
    for group in (STEP_FAN, NAMES_FAN, CHILD_FAN, GATHER):
        stats = await store.checkpoint_stats("r1", group=group)
        assert stats and all(s.group == group for s in stats)
        assert sorted_stats(stats) == sorted_stats(checkpoint_stats_of(rows, group))
    assert await store.checkpoint_stats("r1", group="all:999") == []


async def test_checkpoint_stats_of_empty_and_unknown_runs(store: Any) -> None:
    await store.create_run(make_run("empty"))
    assert await store.checkpoint_stats("empty") == []
    assert await store.checkpoint_stats("empty", group=STEP_FAN) == []
    assert await store.checkpoint_stats("nope") == []
    assert await store.query_checkpoints("empty", CheckpointQuery()) == []
    assert await store.query_checkpoints("nope", CheckpointQuery(limit=5)) == []


async def test_checkpoint_stats_see_in_place_retries_and_folds(store: Any) -> None:
    await seed(store)
    before = by_key(await store.checkpoint_stats("r1", group=STEP_FAN))
    row = await store.get_checkpoint("r1", 6)
    await store.save_checkpoint(replace(row, attempts=row.attempts + 1))  # same status
    after = by_key(await store.checkpoint_stats("r1", group=STEP_FAN))
    key = (STEP_FAN, "running", "step")
    assert after[key].sum_attempts == before[key].sum_attempts + 1
    assert after[key].count == before[key].count

    # the wave in flight settles and is folded: its child rows become one `fan:` row
    await store.save_checkpoint(
        child(17, "r1.all.10.w2.7", "completed", ok=True, parallel_group=CHILD_FAN)
    )
    wave = folded(15, "r1.all.10.w2", 5, [True, False, True, True], parallel_group=CHILD_FAN)
    await store.fold_checkpoints("r1", 15, 18, wave)
    stats = await store.checkpoint_stats("r1", group=CHILD_FAN)
    assert {s.key: s.count for s in stats} == {(CHILD_FAN, "completed", "folded"): 3}
    assert sorted_stats(stats) == sorted_stats(
        checkpoint_stats_of(await store.list_checkpoints("r1"), CHILD_FAN)
    )


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


async def test_sql_checkpoint_stats_read_a_null_enqueued_at_as_started_at(store: Any) -> None:
    """An old row without `enqueued_at` (only SQL can hold one): `minEnqueuedAt` is
    `MIN(COALESCE(enqueued_at, started_at))`, as `list_checkpoints` reads the row."""
    if not hasattr(store, "engine"):
        pytest.skip("SQL stores only: the in-memory store never holds a NULL enqueued_at")
    await seed(store)
    from durably._store.sql.schema import checkpoints

    c = checkpoints.c
    async with store.engine.begin() as conn:
        await conn.execute(
            sa.update(checkpoints)
            .where(c.run_id == "r1", c.seq.in_([2, 3]))
            .values(enqueued_at=None)
        )
    stat = by_key(await store.checkpoint_stats("r1"))[(STEP_FAN, "completed", "step")]
    assert stat.min_enqueued_at == at(2, ms=2)  # seq 2's started_at
    reference = checkpoint_stats_of(await store.list_checkpoints("r1"))
    assert sorted_stats(await store.checkpoint_stats("r1")) == sorted_stats(reference)


async def test_postgres_min_max_name_by_code_point_under_a_linguistic_collation(
    store: Any,
) -> None:
    """A database whose text collates linguistically (ICU `en`: punctuation ignored, case
    folded at the first level) still answers `minName`/`maxName` by code point, like the
    in-memory reference (the store asks for `COLLATE "C"`)."""
    if getattr(getattr(store, "engine", None), "dialect", None) is None or (
        store.engine.dialect.name != "postgresql"
    ):
        pytest.skip("PostgreSQL only")
    alter = "ALTER TABLE durable_step_checkpoints ALTER COLUMN name TYPE text COLLATE "
    async with store.engine.begin() as conn:
        await conn.execute(sa.text(alter + '"en-x-icu"'))
    await seed(store)
    names = by_key(await store.checkpoint_stats("r1"))[(NAMES_FAN, "completed", "step")]
    assert (names.min_name, names.max_name) == ("Zeta", "stepa")
    reference = checkpoint_stats_of(await store.list_checkpoints("r1"))
    assert sorted_stats(await store.checkpoint_stats("r1")) == sorted_stats(reference)
    async with store.engine.connect() as conn:  # the column's own order differs
        plain = (
            await conn.execute(
                sa.text(
                    "SELECT min(name), max(name) FROM durable_step_checkpoints"
                    " WHERE run_id = 'r1' AND parallel_group = :g"
                ),
                {"g": NAMES_FAN},
            )
        ).one()
    assert tuple(plain) != ("Zeta", "stepa")


# ------------------------------------------------------------------ query_checkpoints

QUERIES: list[CheckpointQuery] = [
    CheckpointQuery(),
    CheckpointQuery(group=STEP_FAN),
    CheckpointQuery(group=CHILD_FAN),
    CheckpointQuery(group="all:999"),
    CheckpointQuery(exclude_groups=[STEP_FAN, CHILD_FAN]),  # keeps ungrouped + other groups
    CheckpointQuery(exclude_groups=[]),  # excludes nothing
    CheckpointQuery(exclude_groups=[STEP_FAN, NAMES_FAN, CHILD_FAN, GATHER]),
    CheckpointQuery(statuses=["failed"]),
    CheckpointQuery(statuses=["pending", "running"]),
    CheckpointQuery(statuses=[]),  # matches nothing
    CheckpointQuery(name_prefixes=["fan:"]),
    CheckpointQuery(name_prefixes=["signal:child:", "fan:", "spawn:"]),
    CheckpointQuery(name_prefixes=["spawn:", "spawn:"]),
    CheckpointQuery(name_prefixes=["Fan:", "signal:Child:"]),  # case-sensitive
    CheckpointQuery(name_prefixes=["%", "_"]),  # never LIKE
    CheckpointQuery(name_prefixes=[""]),  # every name starts with ''
    CheckpointQuery(name_prefixes=[]),  # matches nothing
    CheckpointQuery(limit=3),
    CheckpointQuery(offset=5),
    CheckpointQuery(offset=5, limit=4),
    CheckpointQuery(offset=23, limit=10),  # the last row
    CheckpointQuery(offset=24),  # past the end
    CheckpointQuery(offset=1000, limit=1),
    CheckpointQuery(limit=0),
    CheckpointQuery(offset=-3, limit=-1),  # negative counts as 0
    CheckpointQuery(group=STEP_FAN, statuses=["failed"], limit=20),
    CheckpointQuery(group=CHILD_FAN, statuses=["completed"], name_prefixes=["signal:child:"]),
    CheckpointQuery(
        group=CHILD_FAN, statuses=["completed"], name_prefixes=["signal:child:", "fan:"]
    ),
    CheckpointQuery(group=STEP_FAN, exclude_groups=[STEP_FAN]),
    CheckpointQuery(exclude_groups=[CHILD_FAN], statuses=["completed"], offset=2, limit=5),
    CheckpointQuery(name_prefixes=["signal:child:", "fan:", "spawn:"], offset=2, limit=2),
]


async def test_query_checkpoints_equal_the_reference(store: Any) -> None:
    await seed(store)
    rows = await store.list_checkpoints("r1")
    assert len(rows) == 24
    for query in QUERIES:
        got = await store.query_checkpoints("r1", query)
        assert got == query_checkpoints_of(rows, query), query


async def test_query_checkpoints_spot_checks(store: Any) -> None:
    await seed(store)

    async def seqs(**kw: Any) -> list[int]:
        return [row.seq for row in await store.query_checkpoints("r1", CheckpointQuery(**kw))]

    assert await seqs(group=STEP_FAN) == [2, 3, 4, 5, 6]
    assert await seqs(statuses=["failed"]) == [1, 4]
    assert await seqs(exclude_groups=[STEP_FAN, NAMES_FAN, CHILD_FAN]) == [
        0, 1, 20, 21, 22, 23, 24, 25, 30, HANDOFF_SEQ_BASE + 1,
    ]  # fmt: skip
    assert await seqs(name_prefixes=["fan:"]) == [10, 13]
    assert await seqs(name_prefixes=["Fan:"]) == [23]
    assert await seqs(statuses=[]) == []
    assert await seqs(name_prefixes=[]) == []
    assert await seqs(offset=10, limit=5) == [10, 13, 15, 16, 17]


async def test_query_checkpoints_accepts_the_json_form(store: Any) -> None:
    await seed(store)
    query = {"group": CHILD_FAN, "statuses": ["completed"], "namePrefixes": ["signal:child:"]}
    got = await store.query_checkpoints("r1", query)
    assert [row.seq for row in got] == [15, 16, 18]
    assert CheckpointQuery.from_json(query).to_json() == query
    assert await store.query_checkpoints("r1", {"excludeGroups": [], "limit": 2}) == (
        await store.query_checkpoints("r1", CheckpointQuery(limit=2))
    )


async def test_query_checkpoints_decode_payloads_like_list_checkpoints(store: Any) -> None:
    await seed(store)
    listed = {row.seq: row for row in await store.list_checkpoints("r1")}
    for row in await store.query_checkpoints("r1", CheckpointQuery()):
        assert row == listed[row.seq]
    fan = (await store.query_checkpoints("r1", CheckpointQuery(name_prefixes=["fan:"])))[0]
    assert fan.output["count"] == 3 and fan.output["completions"][1]["ok"] is False
    assert fan.output["completions"][1]["details"] == {"i": 1}
    failed = await store.query_checkpoints("r1", CheckpointQuery(statuses=["failed"]))
    assert failed[0].error is not None and failed[0].error.details == [{"field": "cvc"}]
    # a returned row is a copy
    fan.output["count"] = 99
    again = await store.query_checkpoints("r1", CheckpointQuery(name_prefixes=["fan:"]))
    assert again[0].output["count"] == 3


async def test_query_checkpoints_pages_cover_the_run_exactly_once(store: Any) -> None:
    await seed(store)
    rows = await store.list_checkpoints("r1")
    for size in (1, 4, 7, 25, 26):
        pages: list[StepCheckpoint] = []
        offset = 0
        while True:
            page = await store.query_checkpoints("r1", CheckpointQuery(offset=offset, limit=size))
            pages.extend(page)
            offset += size
            if len(page) < size:
                break
        assert pages == rows, size
    group_rows = [row for row in rows if row.parallel_group == CHILD_FAN]
    first = await store.query_checkpoints("r1", CheckpointQuery(group=CHILD_FAN, limit=4))
    rest = await store.query_checkpoints("r1", CheckpointQuery(group=CHILD_FAN, offset=4))
    assert first + rest == group_rows and len(first) == 4 and len(rest) == 2


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


# ------------------------------------------------------------------ a 40 000-row run

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


# ------------------------------------------------------------------ reference helpers


def test_reference_helpers_on_edge_cases() -> None:
    rows = timeline()
    assert checkpoint_stats_of([]) == []
    assert query_checkpoints_of([], CheckpointQuery(limit=3)) == []
    shuffled = list(reversed(rows))
    assert query_checkpoints_of(shuffled, None) == sorted(rows, key=lambda r: r.seq)
    kinds = {s.key[2] for s in checkpoint_stats_of([r for r in rows if r.name == "Fan:x"])}
    assert kinds == {"step"}
    stamp: datetime = at(5)
    only = checkpoint_stats_of([cp(5, "x", enqueued_at=None, started_at=stamp)])
    assert only[0].min_enqueued_at == stamp
