"""State-store cases: scheduler scans (incomplete, pending, due timers; namespaces) and run
leases (try-lock, renew, release, bulk, claim).
"""

from __future__ import annotations

from durably import RunQuery, StateStore

from .base import StoreCases
from .support import T0, at, id_set, ids, make_run, pickup, try_lock


class LeaseCases(StoreCases):
    """The leases cases of the state-store suite."""

    async def test_list_incomplete_runs_is_running_and_cancelling(self, store: StateStore) -> None:
        for status in (
            "pending",
            "running",
            "suspended",
            "cancelling",
            "blocked",
            "completed",
            "failed",
            "cancelled",
            "dead",
        ):
            await store.create_run(make_run(f"run-{status}", status=status))
        got = {r.id for r in await store.list_incomplete_runs()}
        assert got == {"run-running", "run-cancelling"}

    async def test_pickup_is_fifo_with_limit(self, store: StateStore) -> None:
        await store.create_run(make_run("p3", status="pending", created_at=at(3)))
        await store.create_run(make_run("p1", status="pending", created_at=at(1)))
        await store.create_run(make_run("p2b", status="pending", created_at=at(2)))
        await store.create_run(make_run("p2a", status="pending", created_at=at(2)))
        await store.create_run(make_run("r0", status="running", created_at=at(0)))

        assert [r.id for r in await pickup(store, 10)] == ["p1", "p2a", "p2b", "p3"]
        assert [r.id for r in await pickup(store, 2)] == ["p1", "p2a"]
        first = (await pickup(store, 1))[0]
        assert first.input == {"orderId": "o1"} and first.status == "pending"

    async def test_list_due_timers(self, store: StateStore) -> None:
        now = 1_000_000
        await store.create_run(make_run("due-early", status="suspended", wake_at=now - 500))
        await store.create_run(make_run("due-now", status="suspended", wake_at=now))
        await store.create_run(make_run("future", status="suspended", wake_at=now + 1))
        await store.create_run(make_run("no-wake", status="suspended"))
        await store.create_run(make_run("blocked", status="blocked", wake_at=now - 10))
        await store.create_run(make_run("due-mid", status="suspended", wake_at=now - 100))

        got = {r.id for r in await store.list_due_timers(now)}
        # a blocked run is re-checked when its wake comes due, like a suspended one
        assert got == {"due-early", "due-now", "due-mid", "blocked"}
        limited = await store.list_due_timers(now, limit=2)
        assert [r.id for r in limited] == ["due-early", "due-mid"]
        assert await store.list_due_timers(now - 1000) == []

    async def test_namespace_boundaries(self, store: StateStore) -> None:
        # beta's pending run is older than alpha's
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
        await store.create_run(make_run("b-run", status="cancelling", namespace="beta"))
        await store.create_run(make_run("d-run", status="running"))
        await store.create_run(make_run("a-due", status="suspended", namespace="alpha", wake_at=5))
        await store.create_run(make_run("b-due", status="suspended", namespace="beta", wake_at=1))

        assert [r.id for r in await pickup(store, 1, "alpha")] == ["a-new"]
        assert [r.id for r in await pickup(store, 10, "alpha")] == ["a-new", "a-newer"]
        assert [r.id for r in await pickup(store, 10, "default")] == ["d-pend"]
        assert [r.id for r in await pickup(store, 1)] == ["b-old"]
        assert len(await pickup(store, 10)) == 4

        assert {r.id for r in await store.list_incomplete_runs("alpha")} == {"a-run"}
        assert {r.id for r in await store.list_incomplete_runs("beta")} == {"b-run"}
        assert {r.id for r in await store.list_incomplete_runs("default")} == {"d-run"}
        assert {r.id for r in await store.list_incomplete_runs()} == {"a-run", "b-run", "d-run"}
        assert await store.list_incomplete_runs("gamma") == []

        assert [r.id for r in await store.list_due_timers(10, "alpha")] == ["a-due"]
        assert [r.id for r in await store.list_due_timers(10, "alpha", limit=1)] == ["a-due"]
        assert [r.id for r in await store.list_due_timers(10, None, limit=1)] == ["b-due"]
        assert {r.id for r in await store.list_due_timers(10)} == {"a-due", "b-due"}

        assert await id_set(store, RunQuery(namespace="beta")) == {"b-old", "b-run", "b-due"}
        assert await id_set(store, RunQuery(namespace="default")) == {"d-pend", "d-run"}
        assert len(await store.list_runs(RunQuery())) == 9
        # limit after the namespace filter
        assert await ids(store, RunQuery(namespace="alpha", status="pending", limit=1)) == [
            "a-newer"
        ]

    async def test_try_lock_atomic_with_expiry(self, store: StateStore) -> None:
        await store.create_run(make_run())
        assert await try_lock(store, "r1", "A", 2000, 1000) is True
        assert await try_lock(store, "r1", "B", 3000, 1500) is False
        assert await try_lock(store, "r1", "A", 3000, 1500) is False  # not even its owner
        run = await store.get_run("r1")
        assert run is not None and run.locked_by == "A" and run.locked_until == 2000
        assert await try_lock(store, "r1", "B", 4000, 2500) is True
        run = await store.get_run("r1")
        assert run is not None and run.locked_by == "B" and run.locked_until == 4000
        assert run.status == "running" and run.updated_at == T0  # only the lease columns change

    async def test_try_lock_boundary_is_expired(self, store: StateStore) -> None:
        await store.create_run(make_run())
        assert await try_lock(store, "r1", "A", 2000, 1000) is True
        assert await try_lock(store, "r1", "B", 5000, 1999) is False
        assert await try_lock(store, "r1", "B", 5000, 2000) is True

    async def test_try_lock_missing_run(self, store: StateStore) -> None:
        assert await try_lock(store, "ghost", "A", 2000, 1000) is False
        assert await store.get_run("ghost") is None

    async def test_release_allows_immediate_reacquire(self, store: StateStore) -> None:
        await store.create_run(make_run())
        assert await try_lock(store, "r1", "A", 10_000, 1000) is True
        await store.release_run_lock("r1")
        run = await store.get_run("r1")
        assert run is not None and run.locked_by is None and run.locked_until is None
        assert await try_lock(store, "r1", "B", 10_000, 1001) is True
        await store.release_run_lock("ghost")  # no-op

    async def test_renew_only_by_owner_and_renewed_lease_is_honoured(
        self, store: StateStore
    ) -> None:
        await store.create_run(make_run())
        assert await try_lock(store, "r1", "A", 2000, 1000) is True
        assert await store.renew_run_locks("B", 9000) == 0
        run = await store.get_run("r1")
        assert run is not None and run.locked_until == 2000
        assert await store.renew_run_locks("A", 5000) == 1
        assert await try_lock(store, "r1", "B", 6000, 2500) is False  # renewed lease honoured
        assert await try_lock(store, "r1", "B", 6000, 5000) is True
        # a lapsed holder that was not taken over can still renew (expiry not checked)
        assert await store.renew_run_locks("B", 6500) == 1
        run = await store.get_run("r1")
        assert run is not None and run.locked_by == "B" and run.locked_until == 6500
        assert await store.renew_run_locks("A", 1) == 0  # the run was taken over

    async def test_bulk_renew_and_release(self, store: StateStore) -> None:
        for run_id in ("a1", "a2", "b1", "free"):
            await store.create_run(make_run(run_id))
        assert await try_lock(store, "a1", "A", 2000, 1000)
        assert await try_lock(store, "a2", "A", 2500, 1000)
        assert await try_lock(store, "b1", "B", 2000, 1000)

        assert await store.renew_run_locks("A", 9000) == 2
        locks = {r.id: (r.locked_by, r.locked_until) for r in await store.list_runs(RunQuery())}
        assert locks == {
            "a1": ("A", 9000),
            "a2": ("A", 9000),
            "b1": ("B", 2000),
            "free": (None, None),
        }
        assert await store.renew_run_locks("nobody", 9000) == 0

        assert await store.release_locks_of("A") == 2
        locks = {r.id: (r.locked_by, r.locked_until) for r in await store.list_runs(RunQuery())}
        assert locks["a1"] == (None, None) and locks["a2"] == (None, None)
        assert locks["b1"] == ("B", 2000)
        assert await store.release_locks_of("A") == 0
        assert await try_lock(store, "a1", "C", 3000, 1001) is True

    async def test_claim_run(self, store: StateStore) -> None:
        await store.create_run(make_run(search_attributes={"k": 1}))
        claimed = await store.claim_run("r1", "A", 2000, 1000)
        assert claimed is not None
        assert claimed.id == "r1" and claimed.locked_by == "A" and claimed.locked_until == 2000
        assert claimed.input == {"orderId": "o1"} and claimed.search_attributes == {"k": 1}
        assert await store.claim_run("r1", "B", 3000, 1500) is None
        again = await store.claim_run("r1", "B", 3000, 2000)  # boundary: expired
        assert again is not None and again.locked_by == "B"
        assert await store.claim_run("ghost", "A", 2000, 1000) is None
