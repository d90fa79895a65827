"""State-store cases: checkpoint aggregates (`checkpoint_stats`, `query_checkpoints`).

Every store must give the reference answers: `checkpoint_stats` equals
`checkpoint_stats_of(list_checkpoints(run))` (compared as sorted lists), `query_checkpoints`
equals `query_checkpoints_of(list_checkpoints(run), q)`.
"""

from __future__ import annotations

from typing import Any

from durably import StateStore, StepCheckpoint, StepError
from durably._core.aggregates import (
    CheckpointQuery,
    CheckpointStat,
    checkpoint_stats_of,
    query_checkpoints_of,
    stat_sort_key,
)
from durably._core.models import HANDOFF_SEQ_BASE, replace

from .base import StoreCases
from .support import at, make_cp, make_run

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


class AggregateCases(StoreCases):
    """The aggregates cases of the state-store suite."""

    async def test_aggregates_are_present_and_paired(self, store: Any) -> None:
        assert callable(store.checkpoint_stats) and callable(store.query_checkpoints)

    async def test_checkpoint_stats_equal_the_reference(self, store: Any) -> None:
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

    async def test_checkpoint_stats_json_form(self, store: Any) -> None:
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

    async def test_checkpoint_stats_group_narrows(self, store: Any) -> None:
        await seed(store)
        rows = await store.list_checkpoints("r1")
        for group in (STEP_FAN, NAMES_FAN, CHILD_FAN, GATHER):
            stats = await store.checkpoint_stats("r1", group=group)
            assert stats and all(s.group == group for s in stats)
            assert sorted_stats(stats) == sorted_stats(checkpoint_stats_of(rows, group))
        assert await store.checkpoint_stats("r1", group="all:999") == []

    async def test_checkpoint_stats_of_empty_and_unknown_runs(self, store: Any) -> None:
        await store.create_run(make_run("empty"))
        assert await store.checkpoint_stats("empty") == []
        assert await store.checkpoint_stats("empty", group=STEP_FAN) == []
        assert await store.checkpoint_stats("nope") == []
        assert await store.query_checkpoints("empty", CheckpointQuery()) == []
        assert await store.query_checkpoints("nope", CheckpointQuery(limit=5)) == []

    async def test_checkpoint_stats_see_in_place_retries_and_folds(self, store: Any) -> None:
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

    async def test_query_checkpoints_equal_the_reference(self, store: Any) -> None:
        await seed(store)
        rows = await store.list_checkpoints("r1")
        assert len(rows) == 24
        for query in QUERIES:
            got = await store.query_checkpoints("r1", query)
            assert got == query_checkpoints_of(rows, query), query

    async def test_query_checkpoints_spot_checks(self, store: Any) -> None:
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

    async def test_query_checkpoints_accepts_the_json_form(self, store: Any) -> None:
        await seed(store)
        query = {"group": CHILD_FAN, "statuses": ["completed"], "namePrefixes": ["signal:child:"]}
        got = await store.query_checkpoints("r1", query)
        assert [row.seq for row in got] == [15, 16, 18]
        assert CheckpointQuery.from_json(query).to_json() == query
        assert await store.query_checkpoints("r1", {"excludeGroups": [], "limit": 2}) == (
            await store.query_checkpoints("r1", CheckpointQuery(limit=2))
        )

    async def test_query_checkpoints_decode_payloads_like_list_checkpoints(
        self, store: StateStore
    ) -> None:
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

    async def test_query_checkpoints_pages_cover_the_run_exactly_once(
        self, store: StateStore
    ) -> None:
        await seed(store)
        rows = await store.list_checkpoints("r1")
        for size in (1, 4, 7, 25, 26):
            pages: list[StepCheckpoint] = []
            offset = 0
            while True:
                page = await store.query_checkpoints(
                    "r1", CheckpointQuery(offset=offset, limit=size)
                )
                pages.extend(page)
                offset += size
                if len(page) < size:
                    break
            assert pages == rows, size
        group_rows = [row for row in rows if row.parallel_group == CHILD_FAN]
        first = await store.query_checkpoints("r1", CheckpointQuery(group=CHILD_FAN, limit=4))
        rest = await store.query_checkpoints("r1", CheckpointQuery(group=CHILD_FAN, offset=4))
        assert first + rest == group_rows and len(first) == 4 and len(rest) == 2
