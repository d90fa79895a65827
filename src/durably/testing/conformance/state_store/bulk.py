"""State-store cases: the bulk operations of fans (`register_child_waits`, `create_runs`,
`deliver_signals`, `fold_checkpoints`, `claim_runs`).
"""

from __future__ import annotations

from typing import Any

from durably import RunQuery, SignalWaiter, StateStore
from durably._core.models import ChildWait, replace

from .base import StoreCases
from .support import at, make_cp, make_run


class BulkCases(StoreCases):
    """The bulk cases of the state-store suite."""

    async def test_register_child_waits_upserts_waiters_and_never_overwrites_rows(
        self, store: StateStore
    ) -> None:
        assert isinstance(store, StateStore)
        await store.create_run(make_run("p"))
        done = make_cp("p", 1, name="signal:child:c1", kind="signal", status="completed", output=7)
        await store.save_checkpoint(done)
        await store.put_signal_waiter(SignalWaiter("child:c0", "other", 9))

        def wait(i: int, with_row: bool = True) -> ChildWait:
            waiter = SignalWaiter(f"child:c{i}", "p", i, parallel_group="all:0:3")
            row = make_cp(
                "p", i, name=f"signal:child:c{i}", kind="signal", status="running", output=None
            )
            return ChildWait(waiter, replace(row, parallel_group="all:0:3") if with_row else None)

        before = self.round_trips(store)
        await store.register_child_waits([wait(0), wait(1), wait(2, with_row=False)])
        after = self.round_trips(store)
        if before is not None and after is not None:
            assert after - before <= 2  # waiters + placeholders, one each
        waiters = await store.list_signal_waiters("child:")
        assert [(w.token, w.run_id, w.seq, w.parallel_group) for w in waiters] == [
            ("child:c0", "p", 0, "all:0:3"),  # replaced by token
            ("child:c1", "p", 1, "all:0:3"),
            ("child:c2", "p", 2, "all:0:3"),
        ]
        rows = await store.list_checkpoints("p")
        assert [(cp.seq, cp.status, cp.output) for cp in rows] == [
            (0, "running", None),
            (1, "completed", 7),  # an existing row is never overwritten
        ]
        await store.register_child_waits([])  # empty: nothing

    async def test_create_runs_inserts_free_ids_and_reports_holders(
        self, store: StateStore
    ) -> None:
        await store.create_run(make_run("c1", workflow="other"))
        runs = [
            make_run(f"c{i}", status="pending", tags=("durable:parent:p", "fan"), created_at=at(i))
            for i in range(3)
        ]
        assert await store.create_runs(runs) == [None, "other", None]
        assert await store.create_runs(runs[:1]) == ["checkout"]  # idempotent: now held
        assert await store.create_runs([]) == []
        c0 = await store.get_run("c0")
        assert c0 is not None and c0.status == "pending" and c0.input == {"orderId": "o1"}
        assert c0.tags == ("durable:parent:p", "fan")
        c1 = await store.get_run("c1")
        assert c1 is not None and c1.workflow == "other" and not c1.tags
        tagged = await store.list_runs(RunQuery(tag="durable:parent:p"))
        assert sorted(r.id for r in tagged) == ["c0", "c2"]

    async def test_deliver_signals_takes_waiters_and_writes_rows_atomically(
        self, store: StateStore
    ) -> None:
        await store.create_run(make_run("p"))
        for i in range(3):
            await store.put_signal_waiter(SignalWaiter(f"child:c{i}", "p", i, parallel_group="g"))
            await store.save_checkpoint(make_cp("p", i, kind="signal", status="running"))
        written = await store.deliver_signals(
            [("child:c0", {"ok": True, "value": 1}), ("child:c2", {"ok": False}), ("child:x", 5)],
            at(3),
        )
        assert sorted((cp.seq, cp.name, cp.output) for cp in written) == [
            (0, "signal:child:c0", {"ok": True, "value": 1}),
            (2, "signal:child:c2", {"ok": False}),
        ]
        rows = {cp.seq: cp for cp in await store.list_checkpoints("p")}
        assert rows[0].status == "completed" and rows[0].parallel_group == "g"
        assert rows[0].finished_at == at(3) and rows[0].step_id == "p:0"
        assert rows[1].status == "running"
        assert rows[2].output == {"ok": False}
        assert [w.token for w in await store.list_signal_waiters("child:")] == ["child:c1"]
        # a waiter is taken once: a second delivery of the same token writes nothing
        assert await store.deliver_signals([("child:c0", {"ok": True, "value": 2})], at(4)) == []
        first = await store.get_checkpoint("p", 0)
        assert first is not None and first.output == {"ok": True, "value": 1}
        assert await store.deliver_signals([], at(5)) == []

    async def test_claim_runs_leases_listed_pending_runs_by_id(self, store: Any) -> None:
        await store.create_run(make_run("a", status="pending"))
        await store.create_run(make_run("b", status="pending", locked_by="x", locked_until=10_000))
        await store.create_run(make_run("c", status="pending", locked_by="x", locked_until=500))
        await store.create_run(make_run("d", status="running"))
        await store.create_run(make_run("e", status="pending"))
        claimed = await store.claim_runs(["a", "b", "c", "d", "zz"], "me", 9_000, 1_000)
        assert sorted((r.id, r.locked_by, r.locked_until) for r in claimed) == [
            ("a", "me", 9_000),
            ("c", "me", 9_000),  # an expired lease is free
        ]
        assert all(r.status == "pending" for r in claimed)  # a claim leases; it keeps the status
        b = await store.get_run("b")
        assert b is not None and b.locked_by == "x"  # a live lease is never taken
        e = await store.get_run("e")
        assert e is not None and e.locked_by is None  # not listed: untouched
        assert await store.claim_runs(["a"], "other", 9_000, 1_000) == []  # held by "me" now
        assert await store.claim_runs([], "me", 9_000, 1_000) == []

    async def test_fold_checkpoints_replaces_a_seq_range_by_one_row(
        self, store: StateStore
    ) -> None:
        await store.create_run(make_run("p"))
        for seq in range(6):
            await store.save_checkpoint(make_cp("p", seq, name=f"s{seq}"))
        fan = make_cp("p", 1, name="fan:p.all.1", kind="signal", output={"first": 0, "count": 3})
        await store.fold_checkpoints("p", 1, 3, fan)
        rows = await store.list_checkpoints("p")
        assert [(cp.seq, cp.name) for cp in rows] == [
            (0, "s0"),
            (1, "fan:p.all.1"),
            (4, "s4"),
            (5, "s5"),
        ]
        assert rows[1].output == {"first": 0, "count": 3}
