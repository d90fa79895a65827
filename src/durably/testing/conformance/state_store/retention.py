"""State-store cases: retention (`RetentionStore.prune_terminal_runs`): which runs a
policy prunes, the batch bound, dry runs, the rows that go with a run, and the runs that are
never touched (other statuses, live runs, a finished parent whose child is live).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from durably import RetentionPolicy, RunQuery, SignalWaiter, StateStore
from durably._core.models import ms_from_utc
from durably._core.retention import PARENT_TAG_PREFIX

from .base import StoreCases
from .support import T0, make_cp, make_run

DAY = timedelta(days=1)
NOW = ms_from_utc(T0 + 40 * DAY)


def finished(run_id: str, days_ago: float, status: str = "completed", **kw: Any) -> Any:
    when = T0 + 40 * DAY - days_ago * DAY
    return make_run(run_id, status=status, created_at=when, updated_at=when, **kw)


async def seed(store: Any, *runs: Any) -> None:
    for run in runs:
        await store.create_run(run)


async def present(store: Any, *ids: str) -> set[str]:
    return {i for i in ids if await store.get_run(i) is not None}


class RetentionCases(StoreCases):
    """The retention cases of the state-store suite."""

    async def test_max_age_prunes_the_old_run_and_keeps_the_fresh_one(
        self, store: StateStore
    ) -> None:
        await seed(store, finished("old", 30), finished("fresh", 1))
        policy = RetentionPolicy(["completed"], max_age="7d")
        assert await store.prune_terminal_runs(policy, NOW, 100) == ["old"]
        assert await present(store, "old", "fresh") == {"fresh"}

    async def test_max_count_keeps_the_most_recent(self, store: StateStore) -> None:
        await seed(store, finished("a", 3), finished("b", 2), finished("c", 1))
        policy = RetentionPolicy(["completed"], max_count=2)
        assert await store.prune_terminal_runs(policy, NOW, 100) == ["a"]
        assert await present(store, "a", "b", "c") == {"b", "c"}

    async def test_both_bounds_a_run_breaking_either_goes(self, store: StateStore) -> None:
        await seed(store, finished("old", 30), finished("mid", 3), finished("new", 1))
        policy = RetentionPolicy(["completed"], max_age="7d", max_count=1)
        assert sorted(await store.prune_terminal_runs(policy, NOW, 100)) == ["mid", "old"]
        assert await present(store, "old", "mid", "new") == {"new"}

    async def test_other_statuses_and_live_runs_are_never_touched(self, store: StateStore) -> None:
        await seed(
            store,
            finished("failed-old", 30, status="failed"),
            finished("running-old", 30, status="running"),
            finished("suspended-old", 30, status="suspended"),
            finished("done-old", 30),
        )
        await store.save_checkpoint(make_cp("running-old", 0))
        policy = RetentionPolicy(["completed"], max_age="7d", max_count=0)
        assert await store.prune_terminal_runs(policy, NOW, 100) == ["done-old"]
        assert await present(store, "failed-old", "running-old", "suspended-old") == {
            "failed-old",
            "running-old",
            "suspended-old",
        }
        assert len(await store.list_checkpoints("running-old")) == 1

    async def test_batches_are_bounded_and_oldest_first(self, store: StateStore) -> None:
        await seed(store, finished("a", 30), finished("b", 20), finished("c", 10))
        policy = RetentionPolicy(["completed"], max_age="7d")
        assert await store.prune_terminal_runs(policy, NOW, 2) == ["a", "b"]
        assert await store.prune_terminal_runs(policy, NOW, 2) == ["c"]
        assert await store.prune_terminal_runs(policy, NOW, 2) == []
        assert await store.prune_terminal_runs(policy, NOW, 0) == []

    async def test_a_dry_run_deletes_nothing(self, store: StateStore) -> None:
        await seed(store, finished("a", 30), finished("b", 20))
        policy = RetentionPolicy(["completed"], max_age="7d")
        assert await store.prune_terminal_runs(policy, NOW, 100, dry_run=True) == ["a", "b"]
        assert await present(store, "a", "b") == {"a", "b"}

    async def test_a_finished_parent_of_a_live_child_is_kept_until_the_child_finishes(
        self,
        store: StateStore,
    ) -> None:
        child_tags = [PARENT_TAG_PREFIX + "parent"]
        await seed(
            store,
            finished("parent", 30),
            finished("child", 30, status="running", tags=child_tags),
        )
        policy = RetentionPolicy(["completed"], max_age="7d")
        assert await store.prune_terminal_runs(policy, NOW, 100) == []
        await store.update_run("child", {"status": "completed"})
        # the child just finished: it is fresh and stays; its parent may go now
        assert await store.prune_terminal_runs(policy, NOW, 100) == ["parent"]
        assert await present(store, "parent", "child") == {"child"}

    async def test_the_rows_of_a_pruned_run_go_with_it(self, store: StateStore) -> None:
        await seed(
            store,
            finished("gone", 30, tags=["vip"], search_attributes={"customer": "acme"}),
            finished("kept", 1, tags=["vip"], search_attributes={"customer": "acme"}),
        )
        for run_id in ("gone", "kept"):
            await store.save_checkpoint(make_cp(run_id, 0))
            await store.put_signal_waiter(
                SignalWaiter(token=f"approve:{run_id}", run_id=run_id, seq=1)
            )
        policy = RetentionPolicy(["completed"], max_age="7d")
        assert await store.prune_terminal_runs(policy, NOW, 100) == ["gone"]
        assert await store.list_checkpoints("gone") == []
        assert [w.run_id for w in await store.list_signal_waiters("approve:")] == ["kept"]
        by_tag = await store.list_runs(RunQuery(tags=["vip"]))
        assert [r.id for r in by_tag] == ["kept"]
        assert len(await store.list_checkpoints("kept")) == 1
