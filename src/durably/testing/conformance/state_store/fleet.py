"""State-store cases: worker heartbeat rows (`FleetStore`) — upsert, the live window,
namespaces, removal, and lists read bounded.
"""

from __future__ import annotations

from typing import Any

from durably import StateStore
from durably._core.worker_beats import ALL_NAMESPACES, MAX_BEAT_ITEMS, MAX_NAME_CHARS, WorkerBeat

from .base import StoreCases


def beat(instance: str, at: int, namespace: str = "default", **kw: Any) -> WorkerBeat:
    return WorkerBeat(
        namespace=namespace, instance_id=instance, beat_at=at, started_at=at - 1, **kw
    )


class FleetCases(StoreCases):
    """The beats cases of the state-store suite."""

    async def test_a_beat_is_one_row_per_worker_updated_in_place(self, store: StateStore) -> None:
        await store.beat_worker(beat("w1", 1_000, workflows=(("invoices.convert", "1"),)))
        await store.beat_worker(
            beat("w1", 2_000, workflows=(("invoices.convert", "2"),), steps=("pdf.render",))
        )
        [row] = await store.list_worker_beats("default", 0, 100)
        assert row.instance_id == "w1"
        assert row.beat_at == 2_000
        assert row.workflows == (("invoices.convert", "2"),)
        assert row.steps == ("pdf.render",)
        assert row.tokens is None  # it reported no transport

    async def test_only_rows_that_beat_since_are_listed_newest_first(
        self, store: StateStore
    ) -> None:
        await store.beat_worker(beat("old", 1_000))
        await store.beat_worker(beat("mid", 5_000))
        await store.beat_worker(beat("new", 9_000, tokens=("pdf.render",)))
        rows = await store.list_worker_beats("default", 5_000, 100)
        assert [r.instance_id for r in rows] == ["new", "mid"]
        assert rows[0].tokens == ("pdf.render",)
        assert [r.instance_id for r in await store.list_worker_beats("default", 0, 1)] == ["new"]

    async def test_namespaces_and_workers_serving_every_namespace(self, store: StateStore) -> None:
        await store.beat_worker(beat("a", 1_000, namespace="acme"))
        await store.beat_worker(beat("g", 1_000, namespace="globex"))
        await store.beat_worker(beat("all", 1_000, namespace=ALL_NAMESPACES))
        assert {r.instance_id for r in await store.list_worker_beats("acme", 0, 100)} == {
            "a",
            "all",
        }
        assert {r.instance_id for r in await store.list_worker_beats(None, 0, 100)} == {
            "a",
            "g",
            "all",
        }

    async def test_forget_and_prune(self, store: StateStore) -> None:
        await store.beat_worker(beat("w1", 1_000))
        await store.beat_worker(beat("w2", 1_000, namespace="acme"))
        await store.beat_worker(beat("w3", 9_000))
        await store.forget_worker("acme", "w1")  # another namespace's key: nothing
        assert len(await store.list_worker_beats(None, 0, 100)) == 3
        await store.forget_worker("default", "w1")
        assert {r.instance_id for r in await store.list_worker_beats(None, 0, 100)} == {"w2", "w3"}
        assert await store.prune_worker_beats(5_000) == 1
        assert [r.instance_id for r in await store.list_worker_beats(None, 0, 100)] == ["w3"]

    async def test_lists_are_bounded_and_odd_names_dropped(self, store: StateStore) -> None:
        long = "x" * (MAX_NAME_CHARS + 1)
        steps = (long, *(f"s{i}" for i in range(MAX_BEAT_ITEMS + 5)))
        await store.beat_worker(
            beat("w1", 1_000, steps=steps, workflows=((long, "1"), ("ok", "1")))
        )
        [row] = await store.list_worker_beats("default", 0, 100)
        assert long not in row.steps
        assert len(row.steps) == MAX_BEAT_ITEMS - 1  # the cap counts what was stored
        assert row.workflows == (("ok", "1"),)
