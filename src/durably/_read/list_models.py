"""Read-side data objects for run lists, wait descriptors and worker health.

Immutable slotted dataclasses with snake_case attributes; `to_json()` / `from_json()` use
camelCase keys and omit absent optional fields (never `null`). The facet rows a store returns
(`RunFacetRow`, `RunValueFacetRow`, `LeaseOwnerRow`, ...) are defined in
`durably._core.run_facets` and re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

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
class RunWaiting:
    """What an event-parked suspended run waits on: a signal, a webhook, a child or a
    breakpoint, and its name."""

    on: WaitingOn
    name: str

    def to_json(self) -> dict[str, Any]:
        return {"on": self.on, "name": self.name}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunWaiting:
        return cls(on=cast(WaitingOn, str(data["on"])), name=str(data["name"]))


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
class WorkerConcurrency:
    mode: Literal["fixed", "adaptive"]
    limit: int
    min: int | None = None
    max: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "limit": self.limit}
        if self.min is not None:
            out["min"] = self.min
        if self.max is not None:
            out["max"] = self.max
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkerConcurrency:
        return cls(
            mode=cast(Literal["fixed", "adaptive"], str(data.get("mode", "fixed"))),
            limit=int(data.get("limit", 0)),
            min=data.get("min"),
            max=data.get("max"),
        )


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """What one worker reports about itself. Only `concurrency`/`inFlight` are required; the
    best-effort measurements are omitted when unmeasured."""

    concurrency: WorkerConcurrency
    in_flight: int
    runtime: Literal["node", "python"] | None = None
    rss_bytes: int | None = None
    rss_limit_bytes: int | None = None
    rss_pct: float | None = None
    cpu_pct: float | None = None
    throughput_per_min: float | None = None
    p95_ms: float | None = None
    last_adjust: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.runtime is not None:
            out["runtime"] = self.runtime
        out["concurrency"] = self.concurrency.to_json()
        out["inFlight"] = self.in_flight
        for key, value in (
            ("rssBytes", self.rss_bytes),
            ("rssLimitBytes", self.rss_limit_bytes),
            ("rssPct", self.rss_pct),
            ("cpuPct", self.cpu_pct),
            ("throughputPerMin", self.throughput_per_min),
            ("p95Ms", self.p95_ms),
            ("lastAdjust", dict(self.last_adjust) if self.last_adjust else None),
        ):
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkerStatus:
        runtime = data.get("runtime")
        return cls(
            concurrency=WorkerConcurrency.from_json(data.get("concurrency") or {}),
            in_flight=int(data.get("inFlight", 0)),
            runtime=cast(Literal["node", "python"], runtime) if runtime else None,
            rss_bytes=data.get("rssBytes"),
            rss_limit_bytes=data.get("rssLimitBytes"),
            rss_pct=data.get("rssPct"),
            cpu_pct=data.get("cpuPct"),
            throughput_per_min=data.get("throughputPerMin"),
            p95_ms=data.get("p95Ms"),
            last_adjust=data.get("lastAdjust"),
        )


@dataclass(frozen=True, slots=True)
class WorkerHeartbeat:
    """One live worker of a group: its instance id, when it was last seen alive (epoch
    ms) and, for the asking engine itself, its status."""

    group: str
    instance_id: str
    last_beat_at: int
    status: WorkerStatus | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "group": self.group,
            "instanceId": self.instance_id,
            "lastBeatAt": self.last_beat_at,
        }
        if self.status is not None:
            out["status"] = self.status.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkerHeartbeat:
        status = data.get("status")
        return cls(
            group=str(data["group"]),
            instance_id=str(data["instanceId"]),
            last_beat_at=int(data["lastBeatAt"]),
            status=WorkerStatus.from_json(status) if isinstance(status, Mapping) else None,
        )


@dataclass(frozen=True, slots=True)
class GroupHealth:
    """One worker group: its backlog (`depth`) and the workers seen alive in it."""

    group: str
    depth: int
    live_workers: tuple[WorkerHeartbeat, ...] = ()
    kind: Literal["workflow", "step"] | None = None

    @property
    def alert(self) -> bool:
        """Backlog with nobody to work it (`depth > 0 and no live workers`)."""
        return self.depth > 0 and not self.live_workers

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "group": self.group,
            "depth": self.depth,
            "liveWorkers": [w.to_json() for w in self.live_workers],
        }
        if self.kind is not None:
            out["kind"] = self.kind
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupHealth:
        kind = data.get("kind")
        return cls(
            group=str(data["group"]),
            depth=int(data.get("depth", 0)),
            live_workers=tuple(WorkerHeartbeat.from_json(w) for w in data.get("liveWorkers", ())),
            kind=cast(Literal["workflow", "step"], kind) if kind else None,
        )
