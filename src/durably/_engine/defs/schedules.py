"""`Schedule`: a workflow started on a fixed timetable, declared with `Engine(schedules=[...])`.

Time is cut into windows aligned to the Unix epoch (`every=` long each). The run a window
starts has the id `sched:<schedule id>:<window start, epoch ms>`, and starting a run is
idempotent by id, so a window fires exactly once however many engines tick at the same time
or how often one engine ticks inside it. Each driving engine fires its schedules from its timer
poll, reading the engine's clock, so a test clock moves them.

`cron=` (5 fields, or 6 with leading seconds, through the `croniter` library of the
`durably[cron]` extra) fires at the cron's times in `timezone` (IANA, with DST): a local time
that does not exist that day is skipped, a local time that happens twice fires once (at its
first occurrence); the window start is the fire's absolute epoch ms, so ids stay unique.

`jitter=` delays each window's start by up to that much, so many schedules sharing a
boundary (every hour on the hour) do not all start at once. The delay is pseudo-random but a
function of the window's run id alone, so every engine computes the same start instant and a
window still fires once; it never moves the window's id. A delay never reaches the next
window: `every=` refuses a jitter as long as the interval, and a cron window's delay is kept
below the time to its next fire.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from durably._core.durations import Duration, to_ms

Overlap = Literal["allow", "skip", "buffer_one"]
OVERLAPS: tuple[str, ...] = ("allow", "skip", "buffer_one")

CRON_MISSING = "cron schedules need the croniter library: install 'durably[cron]'"


def window_run_id(schedule_id: str, window_start_ms: int) -> str:
    """The id of the run a schedule's window starts: one id per window, so its start is
    idempotent."""
    return f"sched:{schedule_id}:{window_start_ms}"


@dataclass(frozen=True)
class Schedule:
    """A workflow started once per window of a fixed interval or of a cron timetable.

    `workflow` is a registered workflow or its name; exactly one of `every` (the interval:
    seconds as a number, a `timedelta` or a string such as "5m") or `cron` (5 fields, or 6
    with leading seconds, read in `timezone`, an IANA zone; needs `durably[cron]`).
    `overlap` says what a window does while the previous window's run is still live:
    "allow" starts anyway, "skip" does not start this window, "buffer_one" starts it once
    the live run ends (only the latest held window is kept).
    `max_catchup` is how many missed windows before the current one are started after
    downtime (oldest first; 0: only the current window). A `paused` schedule fires nothing.
    `jitter` (a duration) delays each window's start by a pseudo-random amount below it,
    the same on every engine (`start_delay_ms`); the run id stays the window's.
    `tags` and `search_attributes` are given to every run it starts.
    """

    id: str
    workflow: Any
    input: Any = None
    every: Duration | None = field(default=None, kw_only=True)
    cron: str | None = field(default=None, kw_only=True)
    timezone: str = field(default="UTC", kw_only=True)
    overlap: Overlap = field(default="allow", kw_only=True)
    jitter: Duration | None = field(default=None, kw_only=True)
    max_catchup: int = field(default=0, kw_only=True)
    paused: bool = field(default=False, kw_only=True)
    tags: Sequence[str] = field(default=(), kw_only=True)
    search_attributes: dict[str, str | int | float | bool] | None = field(
        default=None, kw_only=True
    )

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id or ":" in self.id:
            raise ValueError(
                f"schedule id must be a non-empty string without ':' (it is part of the run "
                f"ids), got {self.id!r}"
            )
        name = self.workflow_name
        if not name:
            raise ValueError(f'schedule "{self.id}": workflow must be a workflow or its name')
        if (self.every is None) == (self.cron is None):
            raise ValueError(f'schedule "{self.id}" needs exactly one of every= or cron=')
        if self.cron is not None:
            _check_cron(self.id, self.cron, self.timezone)
        elif self.timezone != "UTC":
            raise ValueError(
                f'schedule "{self.id}": timezone= applies to cron= schedules only; '
                "every= windows are aligned to the Unix epoch"
            )
        elif self.every_ms <= 0:
            raise ValueError(f'schedule "{self.id}": every= must be positive, got {self.every!r}')
        if self.jitter is not None:
            self._check_jitter()
        if self.overlap not in OVERLAPS:
            raise ValueError(
                f'schedule "{self.id}": overlap must be one of {", ".join(OVERLAPS)}, '
                f"got {self.overlap!r}"
            )
        if (
            not isinstance(self.max_catchup, int)
            or isinstance(self.max_catchup, bool)
            or self.max_catchup < 0
        ):
            raise ValueError(
                f'schedule "{self.id}": max_catchup must be a whole number >= 0, '
                f"got {self.max_catchup!r}"
            )

    def _check_jitter(self) -> None:
        assert self.jitter is not None
        jitter = to_ms(self.jitter)
        if jitter <= 0:
            raise ValueError(
                f'schedule "{self.id}": jitter= must be a positive duration, got {self.jitter!r}'
            )
        if self.every is not None and jitter >= self.every_ms:
            raise ValueError(
                f'schedule "{self.id}": jitter= ({jitter} ms) must be shorter than every= '
                f"({self.every_ms} ms): a window's start is never delayed into the next window"
            )

    @property
    def jitter_ms(self) -> int:
        """The jitter in whole milliseconds (0 without one)."""
        return 0 if self.jitter is None else to_ms(self.jitter)

    def start_delay_ms(self, window_ms: int) -> int:
        """How long after `window_ms` its run starts: 0 without jitter, else a value in
        [0, jitter) derived from a hash of the window's run id (the same on every engine),
        kept below the time to the next window."""
        jitter = self.jitter_ms
        if jitter <= 0:
            return 0
        if self.cron is not None:
            following = self.next_window(window_ms)
            if following is not None:
                jitter = min(jitter, following - window_ms)
        if jitter <= 1:
            return 0
        digest = hashlib.sha256(window_run_id(self.id, window_ms).encode()).digest()
        return int.from_bytes(digest[:8], "big") % jitter

    def due_at(self, window_ms: int) -> int:
        """When the window's run starts: the window start plus its jitter delay."""
        return window_ms + self.start_delay_ms(window_ms)

    def next_window(self, now_ms: int) -> int | None:
        """The first window starting strictly after `now_ms`."""
        if self.cron is not None:
            return next_cron_fire_ms(self.cron, now_ms, self.timezone)
        every = self.every_ms
        return now_ms - now_ms % every + every

    @property
    def workflow_name(self) -> str:
        wf = self.workflow
        name = wf if isinstance(wf, str) else getattr(wf, "name", None)
        return name if isinstance(name, str) else ""

    @property
    def every_ms(self) -> int:
        assert self.every is not None
        return to_ms(self.every)

    def window_start(self, now_ms: int) -> int | None:
        """The start of the window `now_ms` falls in (for cron: the latest fire <= now)."""
        if self.cron is not None:
            return prev_cron_fire_ms(self.cron, now_ms, self.timezone)
        every = self.every_ms
        return now_ms - now_ms % every

    def previous_window(self, window_ms: int) -> int | None:
        """The window before the one starting at `window_ms`."""
        if self.cron is not None:
            return prev_cron_fire_ms(self.cron, window_ms - 1, self.timezone)
        return window_ms - self.every_ms if window_ms >= self.every_ms else None

    def windows(self, now_ms: int) -> list[int]:
        """The windows a tick at `now_ms` fires, oldest first: up to `max_catchup` missed ones
        (never before the epoch), then the current one."""
        current = self.window_start(now_ms)
        if current is None:
            return []
        found = [current]
        while len(found) <= self.max_catchup:
            earlier = self.previous_window(found[-1])
            if earlier is None or earlier < 0:
                break
            found.append(earlier)
        return found[::-1]


def _croniter() -> Any:
    try:
        # An optional extra, imported only when a cron schedule is declared.
        croniter = importlib.import_module("croniter")
    except ImportError as exc:
        raise ImportError(CRON_MISSING) from exc
    return croniter.croniter


def _check_cron(schedule_id: str, expr: str, timezone: str) -> None:
    fields = expr.split()
    cron = _croniter()
    if len(fields) not in (5, 6) or not cron.is_valid(expr, second_at_beginning=len(fields) == 6):
        raise ValueError(
            f'schedule "{schedule_id}": invalid cron expression {expr!r} (5 fields '
            "'m h dom mon dow', or 6 with leading seconds)"
        )
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f'schedule "{schedule_id}": unknown time zone {timezone!r}') from exc


def _to_utc_ms(local: datetime, zone: ZoneInfo) -> int | None:
    """Epoch ms of a naive local wall time in `zone`; None when that time does not exist
    (skipped by a DST change). A repeated time is taken at its first occurrence."""
    aware = local.replace(tzinfo=zone, fold=0)
    back = aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None)
    if back != local:
        return None
    return round(aware.timestamp() * 1000)


def prev_cron_fire_ms(expr: str, now_ms: int, timezone: str = "UTC") -> int | None:
    """The most recent fire time <= `now_ms` of `expr` in `timezone` (epoch ms)."""
    zone = ZoneInfo(timezone)
    six = len(expr.split()) == 6
    local_now = datetime.fromtimestamp(now_ms / 1000, UTC).astimezone(zone).replace(tzinfo=None)
    # croniter walks naive wall time (no DST jumps); each candidate is then placed in the zone.
    it = _croniter()(expr, local_now + timedelta(milliseconds=1), second_at_beginning=six)
    for _ in range(1000):
        candidate: datetime = it.get_prev(datetime)
        at = _to_utc_ms(candidate, zone)
        if at is not None and at <= now_ms:
            return at
    return None


def next_cron_fire_ms(expr: str, now_ms: int, timezone: str = "UTC") -> int | None:
    """The first fire time strictly after `now_ms` of `expr` in `timezone` (epoch ms)."""
    zone = ZoneInfo(timezone)
    six = len(expr.split()) == 6
    local_now = datetime.fromtimestamp(now_ms / 1000, UTC).astimezone(zone).replace(tzinfo=None)
    it = _croniter()(expr, local_now, second_at_beginning=six)
    for _ in range(1000):
        candidate: datetime = it.get_next(datetime)
        at = _to_utc_ms(candidate, zone)
        if at is not None and at > now_ms:
            return at
    return None


def check_schedules(schedules: Sequence[Schedule], workflows: Sequence[str] | None) -> None:
    """At engine construction: duplicate ids, and (when the engine knows its workflows) a
    schedule of a workflow it does not register, are errors."""
    seen: set[str] = set()
    for schedule in schedules:
        if not isinstance(schedule, Schedule):
            raise TypeError(
                f"Engine(schedules=...) takes durably.Schedule values, got {schedule!r}"
            )
        if schedule.id in seen:
            raise ValueError(f'duplicate schedule id "{schedule.id}"')
        seen.add(schedule.id)
        if workflows is not None and schedule.workflow_name not in workflows:
            raise ValueError(
                f'schedule "{schedule.id}": unknown workflow "{schedule.workflow_name}" '
                f"(registered: {', '.join(sorted(workflows)) or 'none'})"
            )
