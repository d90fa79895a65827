"""Read-side data objects for run lists, facets, wait descriptors and worker health
(run-detail.md §2–§6).

Same style as `durably._read.models`: immutable slotted dataclasses with snake_case
attributes; `to_json()` / `from_json()` use the spec's camelCase keys and omit absent optional
fields (never `null`), except the documented nullable ones (`RunFacetRow.origin`,
`RunValueFacetRow.value`), which are always present.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from durably._core.models import RunStatus, WorkflowRun

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

#: run-detail.md §5 defaults.
RUN_VALUE_FACET_LIMIT = 100
RUN_VALUE_FACET_SCAN = 5000

WaitingOn = Literal["signal", "webhook", "child", "breakpoint"]
RunValueField = Literal[
    "workflow", "status", "origin", "namespace", "tag", "attributeKey", "attributeValue"
]
#: The axes that are columns of `durable_workflow_runs` (`axis_is_run_column`).
COLUMN_AXES: frozenset[str] = frozenset({"workflow", "status", "origin", "namespace"})
_FIELDS: frozenset[str] = COLUMN_AXES | {"tag", "attributeKey", "attributeValue"}


# ---------------------------------------------------------------- §2 list rows


@dataclass(frozen=True, slots=True)
class RunWaiting:
    """What an event-parked suspended run waits on (run-detail.md §2)."""

    on: WaitingOn
    name: str

    def to_json(self) -> dict[str, Any]:
        return {"on": self.on, "name": self.name}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunWaiting:
        return cls(on=cast(WaitingOn, str(data["on"])), name=str(data["name"]))


#: Payload fields a list row (`RunListRow`, run-detail.md §12.3) leaves out.
_PAYLOAD_KEYS = ("input", "output", "error")


@dataclass(frozen=True, slots=True)
class RunListItem:
    """`RunListItem = WorkflowRun + {waiting?}` (run-detail.md §2). The JSON is the run's own
    JSON with a `waiting` key when the run resolves to one."""

    run: WorkflowRun
    waiting: RunWaiting | None = None

    def to_json(self) -> dict[str, Any]:
        out = self.run.to_json()
        if self.waiting is not None:
            out["waiting"] = self.waiting.to_json()
        return out

    def to_row_json(self) -> dict[str, Any]:
        """The HTTP list row (`RunListRow`, §12.3): no `input`, `output` or `error`."""
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


# ---------------------------------------------------------------- §4 run facets


@dataclass(frozen=True, slots=True)
class RunFacetRow:
    """One `GROUP BY status, origin` cell (run-detail.md §4); `origin` None = unattributed
    (always present in JSON, as `null`)."""

    status: RunStatus
    origin: str | None
    count: int

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "origin": self.origin, "count": self.count}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunFacetRow:
        origin = data.get("origin")
        return cls(
            status=cast(RunStatus, str(data["status"])),
            origin=origin if isinstance(origin, str) else None,
            count=int(data["count"]),
        )


# ---------------------------------------------------------------- §5 value facets


@dataclass(frozen=True, slots=True)
class RunValueAxis:
    """`{field}` or `{field: 'attributeValue', key}` (run-detail.md §5)."""

    field: RunValueField
    key: str | None = None

    def __post_init__(self) -> None:
        if self.field not in _FIELDS:
            raise ValueError(f"unknown run value facet field {self.field!r}")
        if self.field == "attributeValue" and not isinstance(self.key, str):
            raise ValueError("the attributeValue axis needs a `key`")

    def to_json(self) -> dict[str, Any]:
        if self.field == "attributeValue":
            return {"field": self.field, "key": self.key}
        return {"field": self.field}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunValueAxis:
        key = data.get("key")
        return cls(
            field=cast(RunValueField, str(data["field"])),
            key=key if isinstance(key, str) else None,
        )

    @classmethod
    def of(cls, axis: RunValueAxis | Mapping[str, Any] | str) -> RunValueAxis:
        """Accept an axis, its JSON mapping, or a bare field name (`'tag'`)."""
        if isinstance(axis, RunValueAxis):
            return axis
        if isinstance(axis, str):
            return cls(field=cast(RunValueField, axis))
        return cls.from_json(axis)


@dataclass(frozen=True, slots=True)
class RunValueFacetOptions:
    """`{limit?, scan?}` (run-detail.md §5); defaults 100 / 5000."""

    limit: int | None = None
    scan: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.limit is not None:
            out["limit"] = self.limit
        if self.scan is not None:
            out["scan"] = self.scan
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunValueFacetOptions:
        def pick(key: str) -> int | None:
            v = data.get(key)
            return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

        return cls(limit=pick("limit"), scan=pick("scan"))

    @classmethod
    def of(cls, opts: RunValueFacetOptions | Mapping[str, Any] | None) -> RunValueFacetOptions:
        if opts is None:
            return cls()
        if isinstance(opts, RunValueFacetOptions):
            return opts
        return cls.from_json(opts)

    @property
    def effective_limit(self) -> int:
        return self.limit if self.limit else RUN_VALUE_FACET_LIMIT

    @property
    def effective_scan(self) -> int:
        return self.scan if self.scan else RUN_VALUE_FACET_SCAN


@dataclass(frozen=True, slots=True)
class RunValueFacetRow:
    """`{value, count}` (run-detail.md §5); `value` None only for the origin axis's
    unattributed bucket (always present in JSON)."""

    value: str | None
    count: int

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "count": self.count}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunValueFacetRow:
        value = data.get("value")
        return cls(value=value if isinstance(value, str) else None, count=int(data["count"]))


# ---------------------------------------------------------------- §6 worker health


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
    """`WorkerStatus` (run-detail.md §6). Only `concurrency`/`inFlight` are required; the
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
    """`{group, instanceId, lastBeatAt: ms, status?}` (run-detail.md §6)."""

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
    """`{group, depth, liveWorkers, kind?}` (run-detail.md §6)."""

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


# ---------------------------------------------------------------- leases (durably)


@dataclass(frozen=True, slots=True)
class LeaseOwnerRow:
    """(durably) One `GROUP BY namespace, locked_by` cell over live leases: `owner` holds
    `runs` unexpired leases in `namespace`, the latest running until `lease_until` (ms).
    What `worker_health` reads instead of a heartbeat table."""

    namespace: str
    owner: str
    runs: int
    lease_until: int

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "owner": self.owner,
            "runs": self.runs,
            "leaseUntil": self.lease_until,
        }
