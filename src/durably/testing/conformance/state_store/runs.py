"""State-store cases: run rows — create, get, update, delete, round trips."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durably import AttributeFilter, RunQuery, SignalWaiter, StateStore, StepError
from durably._core.models import BufferedSignal
from durably._store.protocol import missing_store_methods, require_store

from .base import StoreCases
from .support import T0, at, ids, make_cp, make_run, take_buffered


class RunCases(StoreCases):
    """The runs cases of the state-store suite."""

    async def test_store_satisfies_protocols(self, store: StateStore) -> None:
        assert missing_store_methods(store) == []  # first: the failure names what is missing
        assert isinstance(store, StateStore)
        assert require_store(store) is store

    async def test_create_then_get_returns_workflow_and_json_input(self, store: StateStore) -> None:
        await store.create_run(make_run())
        run = await store.get_run("r1")
        assert run is not None
        assert run.id == "r1"
        assert run.workflow == "checkout"
        assert run.workflow_version == "1"
        assert run.status == "running"
        assert run.input == {"orderId": "o1"}
        assert run.created_at == T0
        assert run.updated_at == T0
        assert run.output is None and run.error is None

    async def test_get_missing_run_is_none(self, store: StateStore) -> None:
        assert await store.get_run("nope") is None

    async def test_create_duplicate_id_is_an_error(self, store: StateStore) -> None:
        await store.create_run(make_run(input={"v": 1}))
        with pytest.raises(Exception):  # noqa: B017 - the error type is store-specific (PK violation)
            await store.create_run(make_run(input={"v": 2}))
        run = await store.get_run("r1")
        assert run is not None and run.input == {"v": 1}

    async def test_update_status_output_recovery_attempts_and_dead(self, store: StateStore) -> None:
        await store.create_run(make_run())
        await store.update_run(
            "r1", {"status": "completed", "output": {"total": 15}, "recovery_attempts": 2}
        )
        run = await store.get_run("r1")
        assert run is not None
        assert run.status == "completed"
        assert run.output == {"total": 15}
        assert run.recovery_attempts == 2
        assert run.input == {"orderId": "o1"}  # absent key left alone
        await store.update_run("r1", {"status": "dead"})
        run = await store.get_run("r1")
        assert run is not None and run.status == "dead"
        assert run.output == {"total": 15}

    async def test_priority_round_trips_and_absent_stays_absent(self, store: StateStore) -> None:
        await store.create_run(make_run("p7", priority=7))
        await store.create_run(make_run("p0"))
        p7 = await store.get_run("p7")
        p0 = await store.get_run("p0")
        assert p7 is not None and p7.priority == 7
        assert p0 is not None and p0.priority is None

    async def test_namespace_none_reads_default_and_origin_none_stays_none(
        self,
        store: StateStore,
    ) -> None:
        # edge cases: absent namespace/origin
        await store.create_run(make_run(namespace=None, origin=None))
        await store.create_run(make_run("r2", namespace="acme", origin="pkg-a"))
        r1 = await store.get_run("r1")
        r2 = await store.get_run("r2")
        assert r1 is not None and r1.namespace == "default" and r1.origin is None
        assert r2 is not None and r2.namespace == "acme" and r2.origin == "pkg-a"

    @pytest.mark.parametrize(
        "details",
        [
            [{"path": ["amount"], "message": "must be positive"}],
            {"issues": [1, 2, {"deep": None}]},
            "scalar",
            42,
            True,
        ],
    )
    async def test_error_details_round_trip_any_json(self, store: StateStore, details: Any) -> None:
        err = StepError(message="boom", code="validation", details=details, retryable=False)
        await store.create_run(make_run(status="failed", error=err))
        run = await store.get_run("r1")
        assert run is not None and run.error == err
        await store.save_checkpoint(make_cp(status="failed", error=err, output=None))
        cp = await store.get_checkpoint("r1", 0)
        assert cp is not None and cp.error == err

    async def test_tags_and_search_attributes_round_trip(self, store: StateStore) -> None:
        tags = ("b", "a", 'quo"te', "per%cent", "under_score")
        attrs = {"tier": "pro", "amount": 12.5, "count": 3, "vip": True}
        await store.create_run(make_run(tags=tags, search_attributes=attrs))
        run = await store.get_run("r1")
        assert run is not None
        assert run.tags == tags
        assert run.search_attributes == attrs
        assert run.search_attributes is not None
        assert isinstance(run.search_attributes["vip"], bool)

    async def test_reads_return_copies(self, store: StateStore) -> None:
        original_input: dict[str, Any] = {"orderId": "o1", "items": [1, 2]}
        await store.create_run(
            make_run(input=original_input, search_attributes={"tier": "free"}, tags=("x",))
        )
        original_input["items"].append(3)  # mutating the caller's object after the write
        first = await store.get_run("r1")
        assert first is not None and first.search_attributes is not None
        first.search_attributes["tier"] = "hacked"
        first.input["items"].append(99)
        again = await store.get_run("r1")
        assert again is not None
        assert again.search_attributes == {"tier": "free"}
        assert again.input == {"orderId": "o1", "items": [1, 2]}
        listed = await store.list_runs(RunQuery())
        assert listed[0].search_attributes is not None
        listed[0].search_attributes["tier"] = "hacked"
        assert await ids(store, RunQuery(attributes=[AttributeFilter("tier", "eq", "free")])) == [
            "r1"
        ]

        await store.save_checkpoint(make_cp(output={"ok": True, "list": [1]}))
        cp = await store.get_checkpoint("r1", 0)
        assert cp is not None
        cp.output["list"].append(2)
        (listed_cp,) = await store.list_checkpoints("r1")
        assert listed_cp.output == {"ok": True, "list": [1]}

    async def test_delete_run_removes_its_rows_only(self, store: StateStore) -> None:
        await store.create_run(make_run(search_attributes={"tier": "pro"}, tags=("t",)))
        await store.create_run(make_run("r2", search_attributes={"tier": "pro"}))
        await store.save_checkpoint(make_cp())
        await store.save_checkpoint(make_cp(seq=1, name="charge"))
        await store.save_checkpoint(make_cp("r2"))
        await store.put_signal_waiter(SignalWaiter("approve", "r1", 1))
        await store.put_signal_waiter(SignalWaiter("other", "r2", 0))
        await store.buffer_signal("approve", {"ok": True})

        await store.delete_run("r1")

        assert await store.get_run("r1") is None
        assert await store.list_checkpoints("r1") == []
        assert await store.get_checkpoint("r1", 0) is None
        assert [w.token for w in await store.list_signal_waiters("")] == ["other"]
        pro = RunQuery(attributes=[AttributeFilter("tier", "eq", "pro")])
        assert await ids(store, pro) == ["r2"]
        assert await ids(store, RunQuery(tag="t")) == []
        # untouched: the other run and the token-keyed buffer
        assert await store.get_run("r2") is not None
        assert len(await store.list_checkpoints("r2")) == 1
        assert await take_buffered(store, "approve") == BufferedSignal({"ok": True})

    async def test_delete_missing_run_is_a_noop(self, store: StateStore) -> None:
        await store.create_run(make_run())
        await store.delete_run("nope")
        assert await store.get_run("r1") is not None

    async def test_update_run_maps_every_patchable_field(self, store: StateStore) -> None:
        err = StepError(message="boom", code="x")
        await store.create_run(
            make_run(error=err, priority=3, origin="pkg", recovery_attempts=1, namespace="acme")
        )
        await store.update_run("r1", {"error": None})
        run = await store.get_run("r1")
        assert run is not None and run.error is None

        await store.update_run(
            "r1",
            {
                "input": {"orderId": "o2"},
                "tags": ("a", "b"),
                "locked_by": "worker-1",
                "wake_at": 1_781_136_000_000,
                "locked_until": 1_781_136_030_000,
                "awaiting_decision_task_id": "dt-1",
                "workflow_version": "2",
                "workflow": "checkout-v2",
                "output": [1, 2],
                "search_attributes": {"k": "v"},
            },
        )
        run = await store.get_run("r1")
        assert run is not None
        assert run.input == {"orderId": "o2"}
        assert run.tags == ("a", "b")
        assert run.locked_by == "worker-1"
        assert run.wake_at == 1_781_136_000_000
        assert run.locked_until == 1_781_136_030_000
        assert run.awaiting_decision_task_id == "dt-1"
        assert run.workflow_version == "2"
        assert run.workflow == "checkout-v2"
        assert run.output == [1, 2]
        assert run.search_attributes == {"k": "v"}
        assert run.priority == 3 and run.origin == "pkg" and run.namespace == "acme"

        # a key present with None clears the column; namespace None writes 'default'
        await store.update_run(
            "r1",
            {
                "awaiting_decision_task_id": None,
                "locked_by": None,
                "locked_until": None,
                "wake_at": None,
                "priority": None,
                "origin": None,
                "recovery_attempts": None,
                "tags": None,
                "search_attributes": None,
                "output": None,
                "namespace": None,
            },
        )
        run = await store.get_run("r1")
        assert run is not None
        assert run.awaiting_decision_task_id is None
        assert run.locked_by is None and run.locked_until is None and run.wake_at is None
        assert run.priority is None and run.origin is None and run.recovery_attempts is None
        assert run.tags is None and run.search_attributes is None and run.output is None
        assert run.namespace == "default"
        assert run.input == {"orderId": "o2"}

    async def test_update_run_timestamps(self, store: StateStore) -> None:
        await store.create_run(make_run())
        # created_at/updated_at are written only when non-None; an all-None patch is a no-op
        await store.update_run("r1", {"created_at": None, "updated_at": None})
        run = await store.get_run("r1")
        assert run is not None and run.created_at == T0 and run.updated_at == T0

        later = at(90, ms=123)
        await store.update_run("r1", {"status": "suspended", "updated_at": later})
        run = await store.get_run("r1")
        assert run is not None and run.updated_at == later and run.created_at == T0

        # a patch without updated_at stamps "now"
        before = datetime.now(tz=UTC)
        await store.update_run("r1", {"status": "running"})
        run = await store.get_run("r1")
        assert run is not None
        assert (
            before - timedelta(seconds=1)
            <= run.updated_at
            <= datetime.now(UTC) + timedelta(seconds=1)
        )
        assert run.created_at == T0

        await store.update_run("r1", {"created_at": at(-5)})
        run = await store.get_run("r1")
        assert run is not None and run.created_at == at(-5)

    async def test_update_run_empty_patch_is_a_noop(self, store: StateStore) -> None:
        await store.create_run(make_run())
        await store.update_run("r1", {})
        run = await store.get_run("r1")
        assert run is not None and run == make_run()

    async def test_update_missing_run_is_a_noop(self, store: StateStore) -> None:
        await store.update_run("ghost", {"status": "completed"})
        assert await store.get_run("ghost") is None
        assert await store.list_runs(RunQuery()) == []
