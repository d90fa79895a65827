"""durably — durable workflows for asyncio Python.

Write a workflow as plain async Python; every step is checkpointed in SQLite (the embedded
default) so a run survives crashes and restarts and resumes where it stopped.
"""

# `Engine`, `WorkflowCtx` and the fan outcomes (`Settled`, `Fulfilled`, `Rejected`) are
# loaded on first use (`__getattr__` below): they pull in the worker runtime, and a process
# that only starts and reads runs through `durably.Client` (a web tier) should not pay for
# it or depend on it. Everything else here is light and imported at once.

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from durably._core.admission import Queue
from durably._core.bounds import PayloadRejectedError, PayloadTooLargeError
from durably._core.buffered_signals import BufferedSignalInfo
from durably._core.durations import parse_duration
from durably._core.errors import (
    ConcurrencyLimitError,
    DuplicateRunError,
    FatalError,
    GatherError,
    GatherItemFailure,
    InputValidationError,
    InvalidRunIdError,
    NestedWorkflowCallError,
    NonDeterminismError,
    RemoteStepError,
    ReservedTokenError,
    RunFailedError,
    RunIdConflictError,
    RunNotFoundError,
    ScheduleAlreadyExistsError,
    ScheduleNotFoundError,
    SchemaVersionError,
    SerializationError,
    SignalBufferFullError,
    SignalTimeoutError,
    SingletonQueueFullError,
    StepFailedError,
    StoreConnectionError,
    WorkflowBlocked,
    WorkflowNotFoundError,
)
from durably._core.log_context import RunContextFilter
from durably._core.models import (
    AttemptError,
    AttributeFilter,
    RunQuery,
    RunResult,
    RunStatus,
    SignalWaiter,
    StepCheckpoint,
    StepError,
    StepEvent,
    WorkflowRun,
)
from durably._core.quota import Concurrency, ConcurrencyQuota, Singleton
from durably._core.retention import PruneResult, RetentionPolicy
from durably._core.run_activity import ActivityBucket, ActivityWindow
from durably._core.triggers import Batch, Debounce, EventKeyError, EventTrigger
from durably._engine.client.client import Client
from durably._engine.client.handle import RunHandle, UpdateResult
from durably._engine.client.run_gateway import RunGateway
from durably._engine.client.schedule_views import ScheduleDescription, ScheduleRunSummary
from durably._engine.client.schedules import ScheduleClient
from durably._engine.client.sync import SyncClient
from durably._engine.defs.concurrency import AdaptiveConcurrency
from durably._engine.defs.events import EngineEvent, MetricsSnapshot
from durably._engine.defs.intercept import ClientCallInfo, Interceptor, StepCallInfo, TurnInfo
from durably._engine.defs.options import EngineOptions
from durably._engine.defs.registry import (
    OnErrorInput,
    OnErrorRoute,
    RetryPolicy,
    Step,
    Workflow,
    step,
    workflow,
)
from durably._engine.defs.remote_workflows import RemoteWorkflow, remote_workflow
from durably._engine.defs.schedules import Schedule
from durably._engine.defs.step_context import StepContext, SubProcess, current_step
from durably._engine.defs.typed_io import Args
from durably._read.list_models import (
    GroupHealth,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    RunWaiting,
)
from durably._read.models import FanPage, FanSummary, RunDetail
from durably._store.codec import Codec, CodecStateStore
from durably._store.crypto import AesGcmCodec
from durably._store.memory import InMemoryStateStore
from durably._store.protocol import StateStore
from durably.tenant import TenantGateway

if TYPE_CHECKING:
    from durably._engine.engine import Engine
    from durably._engine.run.ctx import WorkflowCtx
    from durably._engine.run.dynamic_ctx import DynamicWorkflowCtx
    from durably._engine.run.fans import Fulfilled, Rejected, Settled

_LAZY = {
    "Engine": "durably._engine.engine",
    "WorkflowCtx": "durably._engine.run.ctx",
    "DynamicWorkflowCtx": "durably._engine.run.dynamic_ctx",
    "Settled": "durably._engine.run.fans",
    "Fulfilled": "durably._engine.run.fans",
    "Rejected": "durably._engine.run.fans",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'durably' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups find it without coming here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__version__ = "0.1.0"

__all__ = [
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
