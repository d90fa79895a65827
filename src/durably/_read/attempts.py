"""Each attempt of a retried step as a span of time, read from the step's stored row.

A step's row keeps ONE start and ONE finish, plus the history of its failed attempts (each
with the moment it failed: `attempt_errors`). That is all the store knows, so the spans are
built from it and say which of their starts are known:

- a failed attempt ends when its error was recorded;
- an attempt begins after the previous one failed (the retry's backoff lies between them and
  is not stored): its `started_at` is that earliest moment, with `start_known=False`;
- the step's own `started_at` is exact for the attempt it belongs to: the first attempt of
  a step retried in process (its row is written once, when the last attempt settles), the
  last attempt of a dispatched step (each attempt rewrites the row). Whichever it is, the
  span that contains it takes it as an exact start;
- the step's last attempt, when it did not fail, ends at the row's `finished_at` (a pending
  or running one has no end yet).

The history keeps the first and the last failures of a long run of retries; the attempts
dropped between them are counted on the first span after the gap (`omitted_before`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from durably._core.jsonshape import JsonObject, json_field
from durably._core.models import (
    ATTEMPT_ERRORS_FIRST,
    CheckpointStatus,
    StepCheckpoint,
    ms_from_utc,
    utc_from_ms,
)

__all__ = ["AttemptSpan", "attempt_spans"]


@dataclass(frozen=True, slots=True)
class AttemptSpan(JsonObject, dates="iso_ms"):
    """One attempt (module docstring). JSON: `{attempt, status, startedAt, startKnown?,
    endedAt?, code?, message?, omittedBefore?}`."""

    attempt: int
    status: CheckpointStatus
    started_at: datetime
    start_known: bool = field(default=False, metadata=json_field(write="truthy"))
    ended_at: datetime | None = None
    code: str | None = None
    message: str | None = None
    omitted_before: int = field(default=0, metadata=json_field(write="truthy"))


def _begin(previous_end: int | None, started: int, end: int) -> tuple[int, bool]:
    """Where an attempt ending at `end` began, and whether that is known: the row's own
    start when it falls in the attempt, else the previous attempt's failure."""
    if (previous_end is None or previous_end < started) and started <= end:
        return started, True
    return (previous_end if previous_end is not None else end), False


def attempt_spans(cp: StepCheckpoint) -> tuple[AttemptSpan, ...]:
    """The attempts of `cp` oldest first; empty for a step that never failed an attempt
    (its row's own start and finish are its one attempt)."""
    errors = cp.attempt_errors or ()
    if not errors:
        return ()
    started = ms_from_utc(cp.started_at)
    spans: list[AttemptSpan] = []
    previous_end: int | None = None
    for index, error in enumerate(errors):
        begin, known = _begin(previous_end, started, error.at)
        spans.append(
            AttemptSpan(
                attempt=error.attempt,
                status="failed",
                started_at=utc_from_ms(begin),
                start_known=known,
                ended_at=utc_from_ms(error.at),
                code=error.code,
                message=error.message,
                omitted_before=cp.attempt_errors_omitted if index == ATTEMPT_ERRORS_FIRST else 0,
            )
        )
        previous_end = error.at
    if cp.status != "failed":
        # Every failed attempt is in the history: a row that is not failed has one more
        # attempt after them, still going or the one that succeeded.
        begin, known = _begin(previous_end, started, max(started, previous_end or started))
        settled = cp.status == "completed"
        spans.append(
            AttemptSpan(
                attempt=cp.attempts,
                status=cp.status,
                started_at=utc_from_ms(begin),
                start_known=known,
                ended_at=cp.finished_at if settled else None,
            )
        )
    return tuple(spans)
