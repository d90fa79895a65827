"""State-store cases: step checkpoints — upsert, lookups by seq/name/prefix, the if-pending
compare-and-set writes and counting.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from durably import SerializationError, StateStore, StepError, StepEvent
from durably._core.models import replace

from .base import StoreCases
from .support import at, make_cp, make_run


class CheckpointCases(StoreCases):
    """The checkpoints cases of the state-store suite."""

    async def test_checkpoint_upsert_get_and_list_by_seq(self, store: StateStore) -> None:
        await store.create_run(make_run())
        await store.save_checkpoint(make_cp(seq=2, name="ship"))
        await store.save_checkpoint(make_cp(seq=0))
        await store.save_checkpoint(make_cp(seq=1, name="charge", status="pending", output=None))
        await store.save_checkpoint(
            make_cp(seq=1, name="charge", output={"charged": 10}, attempts=2)
        )

        rows = await store.list_checkpoints("r1")
        assert [(c.seq, c.name) for c in rows] == [(0, "reserve"), (1, "charge"), (2, "ship")]
        one = await store.get_checkpoint("r1", 1)
        assert one is not None
        assert one.status == "completed" and one.output == {"charged": 10} and one.attempts == 2
        first = await store.get_checkpoint("r1", 0)
        assert first is not None
        assert first.kind == "local" and first.step_id == "r1:0" and first.output == {"ok": True}
        assert await store.list_checkpoints("other") == []

    async def test_checkpoint_fields_round_trip(self, store: StateStore) -> None:
        events = (
            StepEvent(at=1_781_136_000_001, level="info", message="started"),
            StepEvent(
                at=1_781_136_000_002,
                level="warn",
                message="sub",
                sub_id="s1",
                name="n",
                group="g",
                status="done",
                phase="end",
                data={"rows": [1, 2]},
            ),
        )
        cp = make_cp(
            seq=3,
            kind="remote",
            status="pending",
            input={"args": [1, "two"]},
            output=None,
            worker_group="py",
            events=events,
            wake_at=1_781_136_060_000,
            parallel_group="fan-1",
            enqueued_at=at(-1),
            started_at=at(0, ms=5),
            finished_at=at(0, ms=9),
            attempts=4,
        )
        await store.save_checkpoint(cp)
        got = await store.get_checkpoint("r1", 3)
        assert got == cp
        assert await store.get_checkpoint("r1", 4) is None

    async def test_checkpoint_missing_enqueued_at_reads_back_started_at(
        self,
        store: StateStore,
    ) -> None:
        await store.save_checkpoint(make_cp(started_at=at(3), finished_at=at(4)))
        cp = await store.get_checkpoint("r1", 0)
        assert cp is not None
        assert cp.enqueued_at == at(3)
        assert cp.started_at == at(3) and cp.finished_at == at(4)

    async def test_checkpoint_handoff_seq_fits(self, store: StateStore) -> None:
        await store.save_checkpoint(make_cp(seq=1_000_000_007, name="handoff"))
        cp = await store.get_checkpoint("r1", 1_000_000_007)
        assert cp is not None and cp.name == "handoff"

    async def test_get_latest_checkpoint_by_name(self, store: StateStore) -> None:
        for seq, name, value in [
            (0, "event:progress", 10),
            (1, "reserve", None),
            (2, "event:progress", 20),
            (3, "event:progress", 30),
            (4, "event:progressive", 40),
        ]:
            await store.save_checkpoint(make_cp(seq=seq, name=name, output=value))
        latest = await store.get_latest_checkpoint_by_name("r1", "event:progress")
        assert latest is not None and latest.seq == 3 and latest.output == 30
        assert await store.get_latest_checkpoint_by_name("r1", "event:unknown") is None
        assert await store.get_latest_checkpoint_by_name("r2", "event:progress") is None

    async def test_list_checkpoints_by_name_prefix(self, store: StateStore) -> None:
        names = ["reserve", "spawn:0", "signal:child:c2", "event:progress", "spawn:1"]
        for seq, name in enumerate(names):
            await store.save_checkpoint(make_cp(seq=seq, name=name))
        await store.save_checkpoint(make_cp("r2", 0, name="spawn:9"))

        got = await store.list_checkpoints_by_name_prefix("r1", ["signal:child:", "spawn:"])
        assert [c.name for c in got] == ["spawn:0", "signal:child:c2", "spawn:1"]
        assert [c.seq for c in got] == [1, 2, 4]
        assert await store.list_checkpoints_by_name_prefix("r1", []) == []
        # exact and case-sensitive
        assert await store.list_checkpoints_by_name_prefix("r1", ["Spawn:"]) == []
        assert await store.list_checkpoints_by_name_prefix("r1", ["spawn"]) != []

    async def test_name_prefix_has_no_wildcards(self, store: StateStore) -> None:
        for seq, name in enumerate(["a%b", "axb", "a_c", "ayc", "a\\d"]):
            await store.save_checkpoint(make_cp(seq=seq, name=name))

        async def names(prefix: str) -> list[str]:
            return [c.name for c in await store.list_checkpoints_by_name_prefix("r1", [prefix])]

        assert await names("a%") == ["a%b"]
        assert await names("a_") == ["a_c"]
        assert await names("a\\") == ["a\\d"]

    async def test_save_checkpoint_if_pending(self, store: StateStore) -> None:
        await store.save_checkpoint(make_cp(seq=1, status="pending", output=None))
        await store.save_checkpoint(make_cp(seq=2, status="completed", output={"first": True}))
        await store.save_checkpoint(make_cp(seq=3, status="running", output=None))

        won = await store.save_checkpoint_if_pending(make_cp(seq=1, output={"late": 1}, attempts=3))
        assert won is True
        cp1 = await store.get_checkpoint("r1", 1)
        assert cp1 is not None
        assert cp1.status == "completed" and cp1.output == {"late": 1} and cp1.attempts == 3

        # a duplicate delivery for the now-settled row loses
        again = await store.save_checkpoint_if_pending(make_cp(seq=1, status="failed", output=None))
        assert again is False
        cp1 = await store.get_checkpoint("r1", 1)
        assert cp1 is not None and cp1.status == "completed" and cp1.output == {"late": 1}

        assert await store.save_checkpoint_if_pending(make_cp(seq=2, output={"dup": 1})) is False
        cp2 = await store.get_checkpoint("r1", 2)
        assert cp2 is not None and cp2.output == {"first": True}

        assert await store.save_checkpoint_if_pending(make_cp(seq=3)) is False
        cp3 = await store.get_checkpoint("r1", 3)
        assert cp3 is not None and cp3.status == "running"

        # durably: an absent row returns False and writes nothing
        assert await store.save_checkpoint_if_pending(make_cp(seq=9)) is False
        assert await store.get_checkpoint("r1", 9) is None

    async def test_save_checkpoints_if_pending_results_in_order(self, store: StateStore) -> None:
        await store.save_checkpoint(make_cp(seq=1, status="pending", output=None))
        await store.save_checkpoint(make_cp(seq=2, status="completed", output={"kept": 2}))
        await store.save_checkpoint(make_cp(seq=3, status="pending", output=None))
        await store.save_checkpoint(make_cp("r2", 1, status="pending", output=None))

        results = await store.save_checkpoints_if_pending(
            [
                make_cp(seq=1, output={"v": 1}),
                make_cp(seq=2, output={"v": 2}),
                make_cp(seq=7, output={"v": 7}),
                make_cp(seq=3, status="failed", output=None, error=StepError("no")),
                make_cp("r2", 1, output={"v": "r2"}),
            ]
        )
        assert results == [True, False, False, True, True]
        rows = {(c.run_id, c.seq): c for r in ("r1", "r2") for c in await store.list_checkpoints(r)}
        assert rows[("r1", 1)].output == {"v": 1}
        assert rows[("r1", 2)].output == {"kept": 2}
        assert ("r1", 7) not in rows
        assert rows[("r1", 3)].status == "failed" and rows[("r1", 3)].error == StepError("no")
        assert rows[("r2", 1)].output == {"v": "r2"}

    async def test_save_checkpoints_if_pending_duplicate_sees_earlier_write(
        self,
        store: StateStore,
    ) -> None:
        await store.save_checkpoint(make_cp(seq=5, status="pending", output=None))
        results = await store.save_checkpoints_if_pending(
            [
                make_cp(seq=5, status="completed", output={"win": True}),
                make_cp(seq=5, status="failed", output=None, error=StepError("late")),
            ]
        )
        assert results == [True, False]
        cp = await store.get_checkpoint("r1", 5)
        assert cp is not None and cp.status == "completed" and cp.output == {"win": True}

        # a `pending` rewrite keeps the CAS open for the next entry of the same batch
        await store.save_checkpoint(make_cp(seq=6, status="pending", output=None))
        results = await store.save_checkpoints_if_pending(
            [
                make_cp(seq=6, status="pending", output=None, attempts=2),
                make_cp(seq=6, status="completed", output={"second": True}),
            ]
        )
        assert results == [True, True]
        cp6 = await store.get_checkpoint("r1", 6)
        assert cp6 is not None and cp6.status == "completed" and cp6.output == {"second": True}

    async def test_save_checkpoints_if_pending_empty(self, store: StateStore) -> None:
        assert await store.save_checkpoints_if_pending([]) == []

    @pytest.mark.parametrize("bad", [math.nan, math.inf, object()], ids=["nan", "inf", "object"])
    async def test_save_checkpoints_if_pending_is_atomic(self, store: StateStore, bad: Any) -> None:
        await store.save_checkpoint(make_cp(seq=1, status="pending", output=None))
        await store.save_checkpoint(make_cp(seq=2, status="pending", output=None))
        with pytest.raises(SerializationError):
            await store.save_checkpoints_if_pending(
                [
                    make_cp(seq=1, output={"ok": 1}),
                    make_cp(seq=2, output={"bad": bad}),
                ]
            )
        rows = await store.list_checkpoints("r1")
        assert [(c.seq, c.status, c.output) for c in rows] == [
            (1, "pending", None),
            (2, "pending", None),
        ]
        # the engine then retries entry by entry: the good one still wins
        assert await store.save_checkpoints_if_pending([make_cp(seq=1, output={"ok": 1})]) == [True]

    async def test_save_checkpoint_if_pending_rejects_non_json(self, store: StateStore) -> None:
        await store.save_checkpoint(make_cp(seq=1, status="pending", output=None))
        with pytest.raises(SerializationError):
            await store.save_checkpoint_if_pending(make_cp(seq=1, input=math.nan))
        cp = await store.get_checkpoint("r1", 1)
        assert cp is not None and cp.status == "pending"

    async def test_count_checkpoints_inclusive(self, store: StateStore) -> None:
        statuses = ["pending", "pending", "completed", "failed", "pending", "running"]
        for seq, status in enumerate(statuses, start=10):
            await store.save_checkpoint(make_cp(seq=seq, status=status))  # seqs 10..15
        await store.save_checkpoint(make_cp("r2", 10, status="pending"))

        assert await store.count_checkpoints("r1", 10, 15, ["pending"]) == 3
        assert await store.count_checkpoints("r1", 10, 14, ["pending"]) == 3
        assert await store.count_checkpoints("r1", 11, 13, ["pending"]) == 1
        assert await store.count_checkpoints("r1", 11, 11, ["pending"]) == 1
        assert await store.count_checkpoints("r1", 12, 12, ["pending"]) == 0
        assert await store.count_checkpoints("r1", 10, 15, ["completed", "failed"]) == 2
        assert await store.count_checkpoints("r1", 0, 100, ["pending", "running"]) == 4
        assert await store.count_checkpoints("r1", 10, 15, []) == 0
        assert await store.count_checkpoints("r1", 16, 20, ["pending"]) == 0
        assert await store.count_checkpoints("nope", 0, 100, ["pending"]) == 0

    async def test_the_attempt_history_round_trips_through_every_write(
        self,
        store: StateStore,
    ) -> None:
        """`attempt_errors` (and the count of entries dropped from a long history) is stored
        with the row by a plain save and by an if-pending CAS, and read back the same; a row
        without history reads as none."""
        await store.create_run(make_run())
        cp = make_cp(seq=4, kind="remote", status="pending", output=None, attempts=3)
        for n in (1, 2):
            cp = cp.with_attempt_error(n, 1_781_136_000_000 + n, StepError(message=f"m{n}"))
        cp = replace(cp, attempt_errors_omitted=7)
        await store.save_checkpoint(cp)
        got = await store.get_checkpoint("r1", 4)
        assert got is not None
        assert got.attempt_errors == cp.attempt_errors and got.attempt_errors_omitted == 7
        failed = replace(
            got, status="failed", error=StepError(message="m3", code="E", retryable=False)
        )
        failed = failed.with_attempt_error(
            3, 1_781_136_000_003, failed.error or StepError(message="")
        )
        assert await store.save_checkpoint_if_pending(failed)
        [listed] = [c for c in await store.list_checkpoints("r1") if c.seq == 4]
        assert [
            (e.attempt, e.message, e.code, e.retryable) for e in listed.attempt_errors or ()
        ] == [
            (1, "m1", None, None),
            (2, "m2", None, None),
            (3, "m3", "E", False),
        ]
        assert listed.attempt_errors_omitted == 7
        await store.save_checkpoint(make_cp(seq=5))
        plain = await store.get_checkpoint("r1", 5)
        assert (
            plain is not None and plain.attempt_errors is None and plain.attempt_errors_omitted == 0
        )

    @pytest.mark.parametrize("bad", [math.nan, object()])
    async def test_save_checkpoints_is_atomic(self, store: StateStore, bad: Any) -> None:
        with pytest.raises(SerializationError):
            await store.save_checkpoints(
                [make_cp("r8", 1, output={"ok": 1}), make_cp("r8", 2, output={"bad": bad})]
            )
        assert await store.list_checkpoints("r8") == []
