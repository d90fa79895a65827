"""Read-side data objects for run lists, wait descriptors, worker health and the workflow
directory.

Immutable slotted dataclasses with snake_case attributes; `to_json()` / `from_json()` use
camelCase keys and omit absent optional fields (never `null`). The facet rows a store returns
(`RunFacetRow`, `RunValueFacetRow`, `LeaseOwnerRow`, ...) are defined in
`durably._core.run_facets` and re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from durably._core.handshake import AnnouncedWorkflow
from durably._core.jsonshape import JsonObject, json_field
from durably._core.models import WorkflowRun
from durably._core.run_facets import (
    COLUMN_AXES,
    RUN_VALUE_FACET_LIMIT,
    RUN_VALUE_FACET_SCAN,
    LeaseOwnerRow,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
)

__all__ = [
    "COLUMN_AXES",
    "RUN_VALUE_FACET_LIMIT",
    "RUN_VALUE_FACET_SCAN",
    "GroupHealth",
    "LeaseOwnerRow",
    "PartitionSighting",
    "RunFacetRow",
    "RunListItem",
    "RunValueAxis",
    "RunValueFacetOptions",
    "RunValueFacetRow",
    "RunWaiting",
    "WaitingOn",
    "WorkerConcurrency",
    "WorkerDescription",
    "WorkerHeartbeat",
    "WorkerStatus",
    "WorkflowDirectory",
]

WaitingOn = Literal["signal", "webhook", "child", "breakpoint", "worker", "step"]


# ---------------------------------------------------------------- list rows


@dataclass(frozen=True, slots=True)
class RunWaiting(JsonObject):
    """What a waiting run waits on, and its name: a suspended run's signal, webhook, child
    or breakpoint; a parked run's `worker` (no worker serves its workflow, the name); a
    suspended run's remote `step` whose routing token (the name) no live worker beats on.
    `detail` says the last two in words ("no worker serves workflow 'x'")."""

    on: WaitingOn
    name: str
    detail: str | None = None


#: Payload fields the HTTP list row leaves out (a list never ships payloads).
_PAYLOAD_KEYS = ("input", "output", "error")


@dataclass(frozen=True, slots=True)
class RunListItem:
    """A listed run plus what it waits on, when it waits on something. The JSON is the run's own
    JSON with a `waiting` key when the run resolves to one."""

    run: WorkflowRun
    waiting: RunWaiting | None = None

    def to_json(self) -> dict[str, Any]:
        out = self.run.to_json()
        if self.waiting is not None:
            out["waiting"] = self.waiting.to_json()
        return out

    def to_row_json(self) -> dict[str, Any]:
        """The HTTP list row: no `input`, `output` or `error`."""
        out = self.to_json()
        for key in _PAYLOAD_KEYS:
            out.pop(key, None)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunListItem:
        waiting = data.get("waiting")
        return cls(
            run=WorkflowRun.from_json(data),
            waiting=RunWaiting.from_json(waiting) if isinstance(waiting, Mapping) else None,
        )


# ---------------------------------------------------------------- worker health


@dataclass(frozen=True, slots=True)
class WorkerConcurrency(JsonObject):
    mode: Literal["fixed", "adaptive"] = field(metadata=json_field(read_default="fixed"))
    limit: int = field(metadata=json_field(read_default=0))
    min: int | None = None
    max: int | None = None


@dataclass(frozen=True, slots=True)
class WorkerStatus(
    JsonObject,
    order=(
        "runtime",
        "concurrency",
        "in_flight",
        "rss_bytes",
        "rss_limit_bytes",
        "rss_pct",
        "cpu_pct",
        "throughput_per_min",
        "p95_ms",
        "last_adjust",
    ),
):
    """What one worker reports about itself. Only `concurrency`/`inFlight` are required; the
    best-effort measurements are omitted when unmeasured."""

    concurrency: WorkerConcurrency = field(
        metadata=json_field(read_default=WorkerConcurrency(mode="fixed", limit=0))
    )
    in_flight: int = field(metadata=json_field(read_default=0))
    runtime: Literal["node", "python"] | None = None
    rss_bytes: int | None = None
    rss_limit_bytes: int | None = None
    rss_pct: float | None = None
    cpu_pct: float | None = None
    throughput_per_min: float | None = None
    p95_ms: float | None = None
    last_adjust: Mapping[str, Any] | None = field(default=None, metadata=json_field(write="truthy"))


@dataclass(frozen=True, slots=True)
class WorkerDescription(JsonObject):
    """What a live worker's descriptor says about it: which runtime and SDK it is, the
    protocol band it speaks, the capabilities it offers and the workflows and steps it serves
    (sets, in the order the worker sent them). Shown to operators; routing reads the
    descriptors themselves."""

    runtime: str
    sdk: str
    sdk_version: str
    protocol: int
    protocol_range: tuple[int, ...]
    capabilities: tuple[str, ...] = ()
    workflows: tuple[str, ...] = ()
    steps: tuple[str, ...] = ()
    partition: str | None = None
    namespace: str | None = None
    started_at: int = field(default=0, metadata=json_field(read_default=0))
    """Epoch ms the worker process started; 0 when it does not say."""


@dataclass(frozen=True, slots=True)
class WorkerHeartbeat(JsonObject):
    """One live worker of a group: its instance id, when it was last seen alive (epoch
    ms), its status (the asking engine's own, or what a worker reports on its transport) and,
    for a worker on a transport that publishes descriptors, what its descriptor says."""

    group: str
    instance_id: str
    last_beat_at: int
    status: WorkerStatus | None = None
    descriptor: WorkerDescription | None = None


@dataclass(frozen=True, slots=True)
class GroupHealth(JsonObject):
    """One worker group: its backlog (`depth`) and the workers seen alive in it.

    Groups derived from the store (`runs@<namespace>`) have no `transport`; a group a
    transport reports (a routing token: its queue's depth, the workers beating on it) names
    the id of that transport in the engine's pool. `kind` is absent when nothing says whether
    the token carries workflow turns or steps."""

    group: str
    depth: int = field(metadata=json_field(read_default=0))
    live_workers: tuple[WorkerHeartbeat, ...] = ()
    kind: Literal["workflow", "step"] | None = None
    transport: str | None = None

    @property
    def alert(self) -> bool:
        """Backlog with nobody to work it (`depth > 0 and no live workers`)."""
        return self.depth > 0 and not self.live_workers


# ---------------------------------------------------------------- workflow directory


@dataclass(frozen=True, slots=True)
class PartitionSighting(JsonObject):
    """Live workers seen on tokens of another partition than the asking engine's namespace:
    the partition, its tokens and the workers beating on them."""

    partition: str
    groups: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkflowDirectory:
    """The workflows the live workers announce, folded into one entry per name and version
    (`durably._core.handshake.aggregate`): every value some worker stated, and where they
    differ, the `disagreements` (a rollout in progress, or a misconfigured worker: announced
    onError routes are not followed while the workers of a workflow disagree on them).

    `supported` is False when no transport of the engine can say which workers are live;
    `detail` says in a sentence what the answer means (nothing live, sightings elsewhere, a
    transport that could not be read)."""

    supported: bool
    workflows: tuple[AnnouncedWorkflow, ...] = ()
    other_partitions: tuple[PartitionSighting, ...] = ()
    detail: str = ""

    @property
    def disagreements(self) -> tuple[AnnouncedWorkflow, ...]:
        """The workflows whose live workers state different values on some axis."""
        return tuple(w for w in self.workflows if w.disagreements)

    def to_json(self) -> dict[str, Any]:
        return {
            "supported": self.supported,
            "workflows": [w.to_json() for w in self.workflows],
            "otherPartitions": [p.to_json() for p in self.other_partitions],
            "detail": self.detail,
        }
