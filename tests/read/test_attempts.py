"""A retried step's attempts as spans of time, read from its row's failure history: which
starts are known, where each attempt ends, and the attempts the history dropped."""

from __future__ import annotations

from dataclasses import replace

from durably._core.errors import StepError
from durably._core.models import ATTEMPT_ERRORS_FIRST, StepCheckpoint, ms_from_utc
from durably._read.attempts import attempt_spans
from durably._read.rows import describe_row

from .builders import at, row


def failed_at(cp: StepCheckpoint, *seconds: float) -> StepCheckpoint:
    for n, s in enumerate(seconds, start=1):
        cp = cp.with_attempt_error(n, ms_from_utc(at(s)), StepError(message=f"boom {n}"))
    return cp


def shape(cp: StepCheckpoint) -> list[tuple[int, str, float, bool, float | None]]:
    t0 = ms_from_utc(at(0))
    return [
        (
            s.attempt,
            s.status,
            (ms_from_utc(s.started_at) - t0) / 1000,
            s.start_known,
            None if s.ended_at is None else (ms_from_utc(s.ended_at) - t0) / 1000,
        )
        for s in attempt_spans(cp)
    ]


def test_a_step_that_never_failed_has_no_spans() -> None:
    assert attempt_spans(row(0, "charge", started=1, finished=2)) == ()
    assert describe_row(row(0, "charge"), 0).to_json().get("attemptSpans") is None


def test_in_process_retries_start_at_the_rows_start() -> None:
    # Written once, when the last attempt settled: the row's start is attempt 1's.
    cp = failed_at(row(0, "charge", kind="local", attempts=3, started=1, finished=9), 2, 5)
    assert shape(cp) == [
        (1, "failed", 1.0, True, 2.0),
        (2, "failed", 2.0, False, 5.0),
        (3, "completed", 5.0, False, 9.0),
    ]


def test_a_dispatched_steps_row_start_is_its_last_attempts() -> None:
    # Rewritten per attempt: the row's start (6) is the last attempt's; attempt 1's start
    # is not stored (a zero-width span at its failure).
    cp = failed_at(row(0, "charge", attempts=3, started=6, finished=7), 2, 5)
    assert shape(cp) == [
        (1, "failed", 2.0, False, 2.0),
        (2, "failed", 2.0, False, 5.0),
        (3, "completed", 6.0, True, 7.0),
    ]


def test_a_failed_step_ends_with_its_last_failure_and_a_running_one_has_no_end() -> None:
    failed = failed_at(row(0, "charge", status="failed", attempts=2, started=1, finished=4), 2, 4)
    assert [s[:2] for s in shape(failed)] == [(1, "failed"), (2, "failed")]
    running = failed_at(row(0, "charge", status="running", attempts=2, started=3), 2)
    assert shape(running)[-1] == (2, "running", 3.0, True, None)


def test_dropped_attempts_are_counted_on_the_first_span_after_the_gap() -> None:
    cp = row(0, "charge", status="failed", attempts=40, started=0, finished=40)
    for n in range(1, 41):
        cp = cp.with_attempt_error(n, ms_from_utc(at(n)), StepError(message=f"boom {n}"))
    spans = attempt_spans(cp)
    assert cp.attempt_errors_omitted > 0
    assert [s.omitted_before for s in spans].count(0) == len(spans) - 1
    assert spans[ATTEMPT_ERRORS_FIRST].omitted_before == cp.attempt_errors_omitted
    assert (
        spans[ATTEMPT_ERRORS_FIRST].attempt == ATTEMPT_ERRORS_FIRST + 1 + cp.attempt_errors_omitted
    )


def test_the_row_view_carries_the_spans_in_json() -> None:
    cp = failed_at(row(0, "charge", kind="local", attempts=2, started=1, finished=3), 2)
    spans = describe_row(cp, 0).to_json()["attemptSpans"]
    assert [s["attempt"] for s in spans] == [1, 2]
    assert spans[0]["startKnown"] is True and "startKnown" not in spans[1]
    assert spans[0]["message"] == "boom 1" and spans[0]["endedAt"].endswith("Z")
    # a wait row never carries spans, even with a (foreign) history
    wait = replace(cp, name="signal:x", kind="signal")
    assert "attemptSpans" not in describe_row(wait, 0).to_json()
