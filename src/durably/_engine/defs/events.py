"""Engine events (what `Engine.subscribe` listeners receive) and the metrics snapshot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from durably._core.jsonshape import JsonObject, json_field
from durably._core.log_context import durably_logger
from durably._core.models import JSONValue, StepError, StepEvent, now_utc
from durably._engine.defs.tallies import RUN_SECONDS, STEP_SECONDS, MetricSeries, Tallies
from durably._engine.defs.vocab import CANCELLED

log = durably_logger("durably.engine")

# The types this engine emits. `run.blocked`: no live worker offers what a run's next step
# requires (with `requires`, `reason` and `diagnostics`); `run.unrouted`: the onError routes
# the live workers announce for a failed run's workflow disagree, so it was not routed
# (with `reason`).
EngineEventType = Literal[
    "run.started",
    "run.completed",
    "run.failed",
    "run.suspended",
    "run.routed",
    "run.blocked",
    "run.unrouted",
    "step.started",
    "step.completed",
    "step.failed",
    "step.progress",
]


# Where the step of a `step.*` event runs (`EngineEvent.placement`).
StepPlacement = Literal["in_process", "remote"]


@dataclass(frozen=True, slots=True)
class EngineEvent(JsonObject):
    """One engine event; `at` is written at full precision in UTC.

    On `step.*` events, `kind` is the stored kind of the step's row (`local`, `remote`, …:
    how the row is written and replayed, `StepCheckpoint.kind`), not where the step ran: an
    in-process `ctx.step` is written as a `remote` row, because it goes through the same
    transport interface as a dispatched one. `placement` says where it ran: `in_process` —
    in the process of the engine that emits the event (`ctx.step` without a transport, local
    steps, side effects, compensations); `remote` — on a worker reached over a transport (a
    dispatched step, or a row of a workflow turn a remote workflow worker ran). It is a
    separate field, and `kind` keeps its value, so a subscriber that reads `kind` as the
    row's kind reads what it always did. None on `run.*` events (and from an engine too old
    to say).

    A run's end (`run.completed`, `run.failed`) carries the run's life from its creation in
    `duration_ms`; the `run.failed` of a run cancelled through this engine (a cancel, an
    execution timeout) says `reason="cancelled"`."""

    type: EngineEventType
    run_id: str
    workflow: str | None = None
    namespace: str | None = None
    seq: int | None = None
    name: str | None = None
    kind: str | None = None
    placement: StepPlacement | None = None
    output: JSONValue = None
    error: StepError | None = None
    duration_ms: float | None = None
    queue_ms: float | None = None
    attempt: int | None = None
    requires: tuple[str, ...] | None = None
    reason: str | None = None
    diagnostics: JSONValue = None
    # On `step.progress`: the log line or sub-process event the step just recorded.
    event: StepEvent | None = None
    at: datetime = field(default_factory=now_utc)


def lived_ms(created_at: datetime, at: datetime) -> float:
    """A run's life from its creation to `at`, in milliseconds (the `duration_ms` of its
    `run.completed` and `run.failed` events)."""
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    return max(0.0, (at - created_at).total_seconds() * 1000)


def _step_duration_json(value: dict[str, float]) -> dict[str, float]:
    return {"sumMs": value["sum_ms"], "count": value["count"]}


def _step_duration_of(data: Any) -> dict[str, float]:
    return {"sum_ms": float(data["sumMs"]), "count": float(data["count"])}


@dataclass(frozen=True, slots=True)
class MetricsSnapshot(JsonObject):
    """Counters since the engine started: runs and steps by event, runs by workflow, routed
    runs by error code, and the sum and count of completed step durations."""

    runs: dict[str, int]
    routed_by_code: dict[str, int]
    steps: dict[str, int]
    by_workflow: dict[str, dict[str, int]]
    step_duration: dict[str, float] = field(
        metadata=json_field(encode=_step_duration_json, decode=_step_duration_of)
    )


Listener = Callable[[EngineEvent], Any]


class EventBus:
    """Synchronous fan-out to listeners; a listener's error is logged and swallowed, so a
    faulty subscriber never fails a run."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._run_listeners: list[Listener] = []
        self._runs = {
            "started": 0,
            "completed": 0,
            "failed": 0,
            "suspended": 0,
            "routed": 0,
            "blocked": 0,
            "unrouted": 0,
        }
        self._steps = {"started": 0, "completed": 0, "failed": 0}
        self._by_workflow: dict[str, dict[str, int]] = {}
        self._routed_by_code: dict[str, int] = {}
        self._duration_sum = 0.0
        self._duration_count = 0
        self._tallies = Tallies()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)

        def unsubscribe() -> None:
            try:
                self._listeners.remove(listener)
            except ValueError:
                pass

        return unsubscribe

    def on_run_events(self, listener: Listener) -> None:
        """An engine-internal listener that only needs `run.*` events (never unsubscribed)."""
        self._run_listeners.append(listener)

    @property
    def observed(self) -> bool:
        """Whether anyone outside the engine listens (else step events are only counted)."""
        return bool(self._listeners)

    def count_step(
        self,
        what: str,
        workflow: str | None,
        name: str | None,
        *,
        duration_ms: float | None = None,
        error: StepError | None = None,
        attempt: int | None = None,
    ) -> None:
        """Count a step event nobody listens to, without building it (two events per step
        would otherwise be built on the per-step path). A few dictionary updates: the cost
        per step does not depend on how many runs or series there are."""
        if what not in self._steps:
            return
        self._steps[what] += 1
        labels = (workflow or "unknown", name or "unknown")
        if what == "started":
            if attempt is not None and attempt > 1:
                self._tallies.add("step_retries", labels)
        elif what == "completed":
            self._tallies.add("steps_completed", labels)
            if duration_ms is not None:
                self._duration_sum += duration_ms
                self._duration_count += 1
                self._tallies.observe("step_seconds", labels, duration_ms / 1000, STEP_SECONDS)
        else:
            code = (error.code if error is not None else None) or ""
            self._tallies.add("steps_failed", (*labels, code))

    def emit(self, event: EngineEvent) -> None:
        self._count(event)
        if event.type.startswith("run."):
            for internal in self._run_listeners:
                try:
                    internal(event)
                except Exception:
                    log.exception("durably internal event listener failed")
        for listener in tuple(self._listeners):
            try:
                listener(event)
            except Exception:  # a faulty subscriber never fails a run
                log.exception("durably event listener failed")

    def _count(self, event: EngineEvent) -> None:
        kind, _, what = event.type.partition(".")
        if kind == "run" and what in self._runs:
            self._runs[what] += 1
            workflow = event.workflow or "unknown"
            if what in ("started", "completed", "failed"):
                per = self._by_workflow.setdefault(
                    workflow, {"started": 0, "completed": 0, "failed": 0}
                )
                per[what] += 1
            self._tally_run(what, workflow, event)
        elif kind == "step":
            self.count_step(
                what,
                event.workflow,
                event.name,
                duration_ms=event.duration_ms,
                error=event.error,
                attempt=event.attempt,
            )

    def _tally_run(self, what: str, workflow: str, event: EngineEvent) -> None:
        code = (event.error.code if event.error else None) or ""
        if what == "routed":
            self._routed_by_code[code or "*"] = self._routed_by_code.get(code or "*", 0) + 1
            self._tallies.add("runs_routed", (workflow, code))
            return
        if what in ("started", "unrouted", "blocked", "completed"):
            self._tallies.add(f"runs_{what}", (workflow,))
        outcome = what
        if what == "failed":
            # A cancel ends a run with a `run.failed` event: an operator's cancel or an
            # execution timeout says so in `reason`; a cancelled run's own unwind (a saga, a
            # remote turn) carries the cancelled error.
            if event.reason == "cancelled" or event.error == CANCELLED:
                outcome = "cancelled"
                self._tallies.add("runs_cancelled", (workflow,))
            else:
                self._tallies.add("runs_failed", (workflow, code))
        if what in ("completed", "failed") and event.duration_ms is not None:
            seconds = max(0.0, event.duration_ms / 1000)
            self._tallies.observe("run_seconds", (workflow, outcome), seconds, RUN_SECONDS)

    def series(self) -> MetricSeries:
        """A copy of the labelled counters and duration histograms (read on the loop that
        emits, so a copy is consistent)."""
        return self._tallies.snapshot()

    def snapshot(self) -> MetricsSnapshot:
        return MetricsSnapshot(
            runs=dict(self._runs),
            routed_by_code=dict(self._routed_by_code),
            steps=dict(self._steps),
            by_workflow={k: dict(v) for k, v in self._by_workflow.items()},
            step_duration={"sum_ms": self._duration_sum, "count": float(self._duration_count)},
        )
