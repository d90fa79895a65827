"""What `client.schedules.describe` and `list` answer: `ScheduleDescription` and
`ScheduleRunSummary` (frozen, JSON-friendly: times are epoch milliseconds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from durably._engine.defs.schedules import Schedule

__all__ = ["ScheduleDescription", "ScheduleRunSummary", "schedule_json", "window_of_run"]


@dataclass(frozen=True)
class ScheduleRunSummary:
    """One run a schedule started: its id, its status now, and the window it is for (None for
    a run started by `trigger`)."""

    run_id: str
    status: str
    window_ms: int | None

    def to_json(self) -> dict[str, Any]:
        """`{runId, status, windowMs}` (`windowMs` null for a manual trigger)."""
        return {"runId": self.run_id, "status": self.status, "windowMs": self.window_ms}


@dataclass(frozen=True)
class ScheduleDescription:
    """A schedule and what it has done.

    - `schedule`: the `durably.Schedule` itself; `source`: "static" (declared in code with
      `Engine(schedules=...)`) or "persisted" (created at run time, kept in the store).
    - `note`: the note given when it was paused; `next_fires`: the next 5 window starts after
      now (epoch ms; empty while paused — a jittered window's run starts a little after its
      window start).
    - `recent_runs`: its latest runs, newest first (at most 10; runs deleted since are left
      out). `last_fire_at` / `last_run_id`: when it last started a run, and which.
    - `fired_count`: the runs its timetable started (persisted schedules; 0 for static ones,
      whose firing is remembered by no store). `last_error`: why its latest start failed
      (None once a start succeeds).
    - `created_at` / `updated_at`: when it was created and last changed (None for static).
    """

    schedule: Schedule
    source: Literal["static", "persisted"]
    note: str | None
    next_fires: list[int]
    recent_runs: list[ScheduleRunSummary]
    last_fire_at: int | None
    last_run_id: str | None
    fired_count: int
    last_error: str | None
    created_at: int | None
    updated_at: int | None

    def to_json(self) -> dict[str, Any]:
        """The description as JSON, camelCase keys (what `durably schedules describe --json`
        prints); `schedule` holds its options, durations as whole milliseconds."""
        return {
            "schedule": schedule_json(self.schedule),
            "source": self.source,
            "note": self.note,
            "nextFires": list(self.next_fires),
            "recentRuns": [run.to_json() for run in self.recent_runs],
            "lastFireAt": self.last_fire_at,
            "lastRunId": self.last_run_id,
            "firedCount": self.fired_count,
            "lastError": self.last_error,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        }


def schedule_json(schedule: Schedule) -> dict[str, Any]:
    """A schedule's options as JSON (camelCase; `everyMs`/`jitterMs` null when not set)."""
    return {
        "id": schedule.id,
        "workflow": schedule.workflow_name,
        "input": schedule.input,
        "everyMs": None if schedule.every is None else schedule.every_ms,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "overlap": schedule.overlap,
        "jitterMs": schedule.jitter_ms or None,
        "maxCatchup": schedule.max_catchup,
        "paused": schedule.paused,
        "tags": list(schedule.tags),
        "searchAttributes": schedule.search_attributes,
    }


def window_of_run(schedule_id: str, run_id: str) -> int | None:
    """The window a schedule's run id names (`sched:<id>:<window ms>`); None for any other id
    (a manual trigger's `sched:<id>:manual:<ms>`)."""
    prefix = f"sched:{schedule_id}:"
    if not run_id.startswith(prefix):
        return None
    rest = run_id[len(prefix) :]
    return int(rest) if rest.isdigit() else None
