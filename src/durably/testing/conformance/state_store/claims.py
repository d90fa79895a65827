"""State-store cases: `claim_pending_runs` (engines sharing a database split the backlog)."""

from __future__ import annotations

import asyncio
from typing import Any

from durably import StateStore, WorkflowRun

from .base import StoreCases
from .support import at, make_run, pickup, try_lock

NOW = 1_000_000
UNTIL = NOW + 30_000


def claimer(store: StateStore) -> Any:
    return store.claim_pending_runs


def run_ids(runs: list[WorkflowRun]) -> list[str]:
    return [r.id for r in runs]


class ClaimCases(StoreCases):
    """The claims cases of the state-store suite."""

    async def test_claims_oldest_pending_first_up_to_the_limit(self, store: StateStore) -> None:
        claim = claimer(store)
        await store.create_run(make_run("p3", status="pending", created_at=at(3)))
        await store.create_run(make_run("p1", status="pending", created_at=at(1)))
        await store.create_run(make_run("p2b", status="pending", created_at=at(2)))
        await store.create_run(make_run("p2a", status="pending", created_at=at(2)))
        for status in ("running", "suspended", "completed", "cancelling", "blocked"):
            await store.create_run(make_run(f"not-{status}", status=status, created_at=at(0)))

        first = await claim("a", UNTIL, NOW, 2)
        assert run_ids(first) == ["p1", "p2a"]
        for run in first:
            assert run.status == "pending"  # a claim leases; it does not change the status
            assert (run.locked_by, run.locked_until) == ("a", UNTIL)
            assert run.input == {"orderId": "o1"}
            stored = await store.get_run(run.id)
            assert stored is not None and (stored.locked_by, stored.locked_until) == ("a", UNTIL)
        assert run_ids(await claim("b", UNTIL, NOW, 10)) == ["p2b", "p3"]
        assert await claim("c", UNTIL, NOW, 10) == []
        p3 = await store.get_run("p3")
        assert p3 is not None and p3.locked_by == "b"
        for status in ("running", "suspended", "completed", "cancelling", "blocked"):
            untouched = await store.get_run(f"not-{status}")
            assert untouched is not None and untouched.locked_by is None

    async def test_claims_by_priority_then_age(self, store: StateStore) -> None:
        """Higher priority first, then oldest (created_at, id). A run without a priority counts
        as 0: after positive priorities, among the zeros by age, before negative ones. The claim
        and the listing share the order, and a claim is still one statement."""
        claim = claimer(store)
        backlog: list[tuple[str, int | None, int]] = [  # id, priority, created second
            ("old-neg", -3, 0),
            ("lowest", -(2**31), 0),
            ("old-none", None, 1),
            ("zero", 0, 2),
            ("new-high", 9, 5),
            ("old-high", 9, 3),
            ("mid-b", 4, 4),
            ("mid-a", 4, 4),  # same age as mid-b: the id decides
            ("new-none", None, 6),
            ("highest", 2**31 - 1, 7),
        ]
        for run_id, priority, second in backlog:
            await store.create_run(
                make_run(run_id, status="pending", priority=priority, created_at=at(second))
            )
        # Never claimed whatever their priority: not pending, or in another namespace.
        await store.create_run(make_run("busy", status="running", priority=100, created_at=at(0)))
        await store.create_run(
            make_run(
                "elsewhere", status="pending", priority=100, namespace="beta", created_at=at(0)
            )
        )
        order = [
            "highest",
            "old-high",
            "new-high",
            "mid-a",
            "mid-b",
            "old-none",
            "zero",
            "new-none",
            "old-neg",
            "lowest",
        ]
        listed = await pickup(store, 20, "default")
        assert run_ids(listed) == order
        assert run_ids(await pickup(store, 3, "default")) == order[:3]
        assert [r.priority for r in listed[:2]] == [2**31 - 1, 9]
        assert listed[5].priority is None  # counted as 0 for the order, still stored as none

        before = self.round_trips(store)
        first = await claim("a", UNTIL, NOW, 4, "default")
        after = self.round_trips(store)
        if before is not None and after is not None:
            assert after - before == 1  # one statement claims the batch
        assert run_ids(first) == order[:4]
        assert all((r.locked_by, r.locked_until) == ("a", UNTIL) for r in first)
        # A run that arrives later with a higher priority is next, ahead of the older rest.
        await store.create_run(
            make_run("late-urgent", status="pending", priority=50, created_at=at(9))
        )
        assert run_ids(await claim("b", UNTIL, NOW, 2, "default")) == ["late-urgent", "mid-b"]
        assert run_ids(await claim("c", UNTIL, NOW, 10)) == ["elsewhere", *order[5:]]
        assert await claim("d", UNTIL, NOW, 10) == []
        busy = await store.get_run("busy")
        assert busy is not None and busy.locked_by is None

    async def test_a_zero_limit_claims_nothing(self, store: StateStore) -> None:
        claim = claimer(store)
        await store.create_run(make_run("p", status="pending"))
        assert await claim("a", UNTIL, NOW, 0) == []
        run = await store.get_run("p")
        assert run is not None and run.locked_by is None

    async def test_live_leases_are_skipped_and_expired_ones_claimed(
        self, store: StateStore
    ) -> None:
        claim = claimer(store)
        await store.create_run(make_run("live", status="pending", created_at=at(0)))
        await store.create_run(make_run("expired", status="pending", created_at=at(1)))
        await store.create_run(make_run("boundary", status="pending", created_at=at(2)))
        await store.create_run(make_run("free", status="pending", created_at=at(3)))
        assert await try_lock(store, "live", "x", NOW + 1, 0)
        assert await try_lock(store, "expired", "x", NOW - 500, 0)
        assert await try_lock(store, "boundary", "x", NOW, 0)  # locked_until == now: expired

        claimed = await claim("a", UNTIL, NOW, 10)
        assert run_ids(claimed) == ["expired", "boundary", "free"]
        assert all(r.locked_by == "a" for r in claimed)
        live = await store.get_run("live")
        assert live is not None and (live.locked_by, live.locked_until) == ("x", NOW + 1)
        # a claimed run's lease is a lease: not re-taken before it expires, renewable by its owner
        assert not await try_lock(store, "free", "y", UNTIL + 10, NOW)
        assert await store.renew_run_locks("a", UNTIL + 10) == 3  # expired, boundary, free
        assert await claim("a", UNTIL, NOW, 10) == []  # an owner cannot re-claim a live lease
        # once the lease lapses anyone may claim the run
        later = await claim("b", UNTIL + 50_000, UNTIL + 10, 10)
        assert run_ids(later) == ["live", "expired", "boundary", "free"]

    async def test_namespace_applies_before_the_limit(self, store: StateStore) -> None:
        claim = claimer(store)
        await store.create_run(
            make_run("b-old", status="pending", namespace="beta", created_at=at(0))
        )
        await store.create_run(
            make_run("a-new", status="pending", namespace="alpha", created_at=at(1))
        )
        await store.create_run(
            make_run("a-newer", status="pending", namespace="alpha", created_at=at(2))
        )
        await store.create_run(
            make_run("d-pend", status="pending", namespace=None, created_at=at(3))
        )
        await store.create_run(make_run("a-run", status="running", namespace="alpha"))

        assert run_ids(await claim("a", UNTIL, NOW, 1, "alpha")) == ["a-new"]
        assert run_ids(await claim("a", UNTIL, NOW, 5, namespace="alpha")) == ["a-newer"]
        assert run_ids(await claim("a", UNTIL, NOW, 5, "gamma")) == []
        assert run_ids(await claim("a", UNTIL, NOW, 5, "default")) == ["d-pend"]
        assert run_ids(await claim("a", UNTIL, NOW, 5)) == ["b-old"]  # None: every namespace

    async def test_concurrent_claimers_never_get_the_same_run(self, store: StateStore) -> None:
        claim = claimer(store)
        total = 60
        for i in range(total):
            await store.create_run(make_run(f"r{i:03d}", status="pending", created_at=at(i)))
        won: dict[str, list[str]] = {}

        async def worker(owner: str) -> None:
            won[owner] = []
            while True:
                got = await claim(owner, UNTIL, NOW, 3)
                if not got:
                    return
                assert all(r.locked_by == owner for r in got)
                won[owner].extend(r.id for r in got)
                await asyncio.sleep(0)

        await asyncio.gather(*(worker(f"engine-{n}") for n in range(8)))
        claimed = [run_id for ids in won.values() for run_id in ids]
        assert len(claimed) == len(set(claimed)) == total
        for owner, ids in won.items():
            for run_id in ids:
                stored = await store.get_run(run_id)
                assert stored is not None and stored.locked_by == owner
