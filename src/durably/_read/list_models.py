"""Read-side data objects for run lists, wait descriptors and worker health.

Immutable slotted dataclasses with snake_case attributes; `to_json()` / `from_json()` use
camelCase keys and omit absent optional fields (never `null`). The facet rows a store returns
(`RunFacetRow`, `RunValueFacetRow`, `LeaseOwnerRow`, ...) are defined in
`durably._core.run_facets` and re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

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
    "RunFacetRow",
    "RunListItem",
    "RunValueAxis",
    "RunValueFacetOptions",
    "RunValueFacetRow",
    "RunWaiting",
    "WaitingOn",
    "WorkerConcurrency",
    "WorkerHeartbeat",
    "WorkerStatus",
]

WaitingOn = Literal["signal", "webhook", "child", "breakpoint"]


# ---------------------------------------------------------------- list rows


@dataclass(frozen=True, slots=True)
class RunWaiting(JsonObject):
    """What an event-parked suspended run waits on: a signal, a webhook, a child or a
    breakpoint, and its name."""

    on: WaitingOn
    name: str


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
class WorkerHeartbeat(JsonObject):
    """One live worker of a group: its instance id, when it was last seen alive (epoch
    ms) and, for the asking engine itself, its status."""

    group: str
    instance_id: str
    last_beat_at: int
    status: WorkerStatus | None = None


@dataclass(frozen=True, slots=True)
class GroupHealth(JsonObject):
    """One worker group: its backlog (`depth`) and the workers seen alive in it."""

    group: str
    depth: int = field(metadata=json_field(read_default=0))
    live_workers: tuple[WorkerHeartbeat, ...] = ()
    kind: Literal["workflow", "step"] | None = None

    @property
    def alert(self) -> bool:
        """Backlog with nobody to work it (`depth > 0 and no live workers`)."""
        return self.depth > 0 and not self.live_workers
