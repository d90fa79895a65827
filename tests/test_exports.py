"""Pin the public export list of `durably`: adding or removing a name is deliberate."""

from __future__ import annotations

import durably

EXPECTED_EXPORTS = [
    "AesGcmCodec",
    "AttributeFilter",
    "BufferedSignalInfo",
    "Client",
    "Codec",
    "CodecStateStore",
    "ConcurrencyLimitError",
    "Engine",
    "EngineEvent",
    "EngineOptions",
    "FanPage",
    "FanSummary",
    "FatalError",
    "Fulfilled",
    "GatherError",
    "GatherItemFailure",
    "InMemoryStateStore",
    "InputValidationError",
    "InvalidRunIdError",
    "MetricsSnapshot",
    "NestedWorkflowCallError",
    "NonDeterminismError",
    "OnErrorInput",
    "OnErrorRoute",
    "Rejected",
    "RemoteStepError",
    "ReservedTokenError",
    "RetryPolicy",
    "RunDetail",
    "RunFailedError",
    "RunHandle",
    "RunIdConflictError",
    "RunNotFoundError",
    "RunQuery",
    "RunResult",
    "RunStatus",
    "SchemaVersionError",
    "SerializationError",
    "Settled",
    "SignalBufferFullError",
    "SignalTimeoutError",
    "SignalWaiter",
    "SingletonQueueFullError",
    "StateStore",
    "Step",
    "StepCheckpoint",
    "StepError",
    "StepEvent",
    "StepFailedError",
    "StoreConnectionError",
    "UpdateResult",
    "Workflow",
    "WorkflowBlocked",
    "WorkflowCtx",
    "WorkflowNotFoundError",
    "WorkflowRun",
    "__version__",
    "parse_duration",
    "step",
    "workflow",
]


def test_all_is_pinned() -> None:
    assert sorted(durably.__all__) == EXPECTED_EXPORTS


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
        "WorkflowBlocked",
    ):
        assert issubclass(getattr(durably, name), Exception), name
    assert durably.NonDeterminismError.code == "non_determinism"
    assert callable(durably.step) and callable(durably.workflow)
    assert isinstance(durably.__version__, str)
