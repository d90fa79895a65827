"""Pin the public export list of `durably`: adding or removing a name is deliberate."""

from __future__ import annotations

import typing

import durably

EXPECTED_EXPORTS = [
    "ActivityBucket",
    "ActivityWindow",
    "AdaptiveConcurrency",
    "AesGcmCodec",
    "Args",
    "AttemptError",
    "AttributeFilter",
    "Batch",
    "BufferedSignalInfo",
    "Client",
    "ClientCallInfo",
    "Codec",
    "CodecStateStore",
    "Concurrency",
    "ConcurrencyLimitError",
    "ConcurrencyQuota",
    "Debounce",
    "DuplicateRunError",
    "DynamicWorkflowCtx",
    "Engine",
    "EngineEvent",
    "EngineOptions",
    "EventKeyError",
    "EventTrigger",
    "FanPage",
    "FanSummary",
    "FatalError",
    "Fulfilled",
    "GatherError",
    "GatherItemFailure",
    "GroupHealth",
    "InMemoryStateStore",
    "InputValidationError",
    "Interceptor",
    "InvalidRunIdError",
    "MetricsSnapshot",
    "NestedWorkflowCallError",
    "NonDeterminismError",
    "OnErrorInput",
    "OnErrorRoute",
    "PayloadRejectedError",
    "PayloadTooLargeError",
    "PruneResult",
    "Queue",
    "Rejected",
    "RemoteStepError",
    "RemoteWorkflow",
    "ReservedTokenError",
    "RetentionPolicy",
    "RetryPolicy",
    "RunContextFilter",
    "RunDetail",
    "RunFacetRow",
    "RunFailedError",
    "RunGateway",
    "RunHandle",
    "RunIdConflictError",
    "RunNotFoundError",
    "RunQuery",
    "RunResult",
    "RunStatus",
    "RunValueAxis",
    "RunValueFacetOptions",
    "RunValueFacetRow",
    "RunWaiting",
    "Schedule",
    "ScheduleAlreadyExistsError",
    "ScheduleClient",
    "ScheduleDescription",
    "ScheduleNotFoundError",
    "ScheduleRunSummary",
    "SchemaVersionError",
    "SerializationError",
    "Settled",
    "SignalBufferFullError",
    "SignalTimeoutError",
    "SignalWaiter",
    "Singleton",
    "SingletonQueueFullError",
    "StateStore",
    "Step",
    "StepCallInfo",
    "StepCheckpoint",
    "StepContext",
    "StepError",
    "StepEvent",
    "StepFailedError",
    "StoreConnectionError",
    "SubProcess",
    "SyncClient",
    "TenantGateway",
    "TurnInfo",
    "UpdateResult",
    "Workflow",
    "WorkflowBlocked",
    "WorkflowCtx",
    "WorkflowNotFoundError",
    "WorkflowRun",
    "__version__",
    "current_step",
    "parse_duration",
    "remote_workflow",
    "step",
    "workflow",
]


def test_all_is_pinned() -> None:
    assert sorted(durably.__all__) == EXPECTED_EXPORTS


def test_the_testing_kit_is_pinned() -> None:
    import durably.testing

    exported = sorted(durably.testing.__all__)
    assert exported == sorted(
        ["StoreCrashed", "TestClock", "WorkflowEnvironment", *TESTING_HISTORY_EXPORTS]
    )
    assert all(hasattr(durably.testing, name) for name in exported)


def test_all_is_sorted_and_unique() -> None:
    assert list(durably.__all__) == sorted(set(durably.__all__))


def test_every_export_resolves() -> None:
    missing = [name for name in durably.__all__ if not hasattr(durably, name)]
    assert missing == []


def test_star_import_matches_all() -> None:
    namespace: dict[str, object] = {}
    exec("from durably import *", namespace)
    exported = {name for name in namespace if name != "__builtins__"}
    assert exported == set(durably.__all__)


def test_binding_api_names() -> None:
    """The binding public names are present and of the right kind."""
    for name in (
        "FatalError",
        "GatherError",
        "NonDeterminismError",
        "SignalTimeoutError",
        "RemoteStepError",
        "RunFailedError",
        "ConcurrencyLimitError",
        "SingletonQueueFullError",
        "NestedWorkflowCallError",
    ):
        assert issubclass(getattr(durably, name), Exception), name
    # Parking a run `blocked` is control flow, like a suspension: a body's `except Exception`
    # must not swallow it and carry on without the step.
    assert issubclass(durably.WorkflowBlocked, BaseException)
    assert not issubclass(durably.WorkflowBlocked, Exception)
    assert durably.NonDeterminismError.code == "non_determinism"
    assert callable(durably.step) and callable(durably.workflow)
    assert isinstance(durably.__version__, str)


def test_read_side_models_are_what_the_public_read_methods_answer() -> None:
    """The read-side objects are exported because the public read methods of `Engine` and
    `Client` return (or accept) them: a caller must be able to name them."""
    for owner in (durably.Engine, durably.Client):
        assert typing.get_type_hints(owner.get_run_detail)["return"] == durably.RunDetail | None
        assert typing.get_type_hints(owner.get_fan_members)["return"] == durably.FanPage | None
        assert typing.get_type_hints(owner.run_facets)["return"] == list[durably.RunFacetRow]
        value_facets = typing.get_type_hints(owner.run_value_facets)
        assert value_facets["return"] == list[durably.RunValueFacetRow]
        assert durably.RunValueAxis in typing.get_args(value_facets["axis"])
        assert durably.RunValueFacetOptions in typing.get_args(value_facets["options"])
        activity = typing.get_type_hints(owner.run_activity)
        assert activity["return"] == list[durably.ActivityBucket]
        assert activity["window"] == durably.ActivityWindow
        waiting = typing.get_type_hints(owner.waiting_for)["return"]
        assert waiting == dict[str, durably.RunWaiting]
    health = typing.get_type_hints(durably.Engine.worker_health)["return"]
    assert health == list[durably.GroupHealth]


CONFORMANCE_EXPORTS = [
    "Admission",
    "AdmissionBackend",
    "AdmissionBackendSuite",
    "AdmissionWorld",
    "BackendWorld",
    "ManualClock",
    "QueueStats",
    "StateStoreSuite",
    "StateStoreUnavailable",
    "StoreClock",
    "TransportSuite",
]


def test_conformance_exports_are_pinned_and_resolve() -> None:
    """`durably.testing.conformance`, the suites a third-party implementation runs."""
    from durably.testing import conformance

    assert list(conformance.__all__) == CONFORMANCE_EXPORTS
    assert [name for name in conformance.__all__ if not hasattr(conformance, name)] == []


def test_import_durably_loads_neither_pytest_nor_the_suites() -> None:
    """Only `durably.testing.conformance` imports pytest; without pytest it says what to
    install. Checked in a fresh interpreter, where nothing was imported yet."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "import durably, durably.testing\n"
        "assert 'pytest' not in sys.modules, 'import durably loaded pytest'\n"
        "assert 'durably.testing.conformance' not in sys.modules\n"
        "sys.modules['pytest'] = None  # as if pytest were not installed\n"
        "try:\n"
        "    import durably.testing.conformance\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert "install pytest and pytest-asyncio" in done.stdout, done.stdout + done.stderr
    assert "missing: pytest" in done.stdout


# `durably.testing`'s histories, replay, faults and assertions (pinned with the rest of the
# testing kit above).
TESTING_HISTORY_EXPORTS = [
    "HistoryFormatError",
    "ReplayResult",
    "Replayer",
    "RunHistory",
    "assert_output",
    "assert_run_status",
    "assert_step_attempts",
    "assert_steps_ran",
    "fail_once",
    "fail_times",
    "history_files",
    "load_history",
    "recorded_steps",
    "replay_histories",
]


def test_the_testing_kit_lists_its_names_sorted() -> None:
    import durably.testing

    assert list(durably.testing.__all__) == sorted(set(durably.testing.__all__))
