"""Assertions over a run, read through the public read API of a `Client` or an `Engine`.

Each raises `AssertionError` with the run id, what was expected and what the run has, so a
failing test says what went wrong without a debugger."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from durably._core.models import HANDOFF_SEQ_BASE, StepCheckpoint
from durably._read.models import RunDetail

__all__ = [
    "RunDetailSource",
    "assert_output",
    "assert_run_status",
    "assert_step_attempts",
    "assert_steps_ran",
    "recorded_steps",
]

# The names the engine gives the rows of primitives that are not steps, though recorded with
# kind `local`: they are left out of `recorded_steps`.
_MARKER_NAMES = frozenset({"sideEffect", "now", "searchAttributes"})
_MARKER_PREFIXES = ("patch:", "spawn:", "event:")


class RunDetailSource(Protocol):
    """What the assertions read runs through: a `durably.Client` or a `durably.Engine`."""

    async def get_run_detail(self, run_id: str) -> RunDetail | None: ...


async def _detail(source: RunDetailSource, run_id: str) -> RunDetail:
    detail = await source.get_run_detail(run_id)
    if detail is None:
        raise AssertionError(f"run {run_id!r} not found")
    return detail


def _is_step(cp: StepCheckpoint) -> bool:
    if cp.seq < 0 or cp.seq >= HANDOFF_SEQ_BASE:  # undo rows and onError handoffs
        return False
    if cp.kind == "remote":
        return True
    if cp.kind != "local":
        return False
    return cp.name not in _MARKER_NAMES and not cp.name.startswith(_MARKER_PREFIXES)


async def recorded_steps(source: RunDetailSource, run_id: str) -> list[str]:
    """The names of the run's steps in seq order: `ctx.step` calls (and step-fan members)
    and `ctx.local_step` calls. Rows of other primitives (sleeps, signals, children,
    patches, events, side effects, `ctx.now`) and compensations are left out."""
    detail = await _detail(source, run_id)
    return [cp.name for cp in detail.timeline if _is_step(cp)]


async def assert_steps_ran(source: RunDetailSource, run_id: str, names: Sequence[str]) -> None:
    """The run's steps (`recorded_steps`) are exactly `names`, in this order."""
    actual = await recorded_steps(source, run_id)
    expected = list(names)
    if actual != expected:
        raise AssertionError(
            f"run {run_id!r}: expected steps {expected}, but the run recorded {actual}"
        )


async def assert_step_attempts(
    source: RunDetailSource, run_id: str, attempts: Mapping[str, int]
) -> None:
    """Each named step took the given number of attempts (`{name: attempts}`). A name the
    run recorded more than once (a step called in a loop) must have that count on every
    call."""
    detail = await _detail(source, run_id)
    rows = [cp for cp in detail.timeline if _is_step(cp)]
    wrong: list[str] = []
    for name, expected in attempts.items():
        counts = [cp.attempts for cp in rows if cp.name == name]
        if not counts:
            wrong.append(f"{name!r}: expected {expected} attempts, but the run has no such step")
        elif any(count != expected for count in counts):
            shown = counts[0] if len(counts) == 1 else counts
            wrong.append(f"{name!r}: expected {expected} attempts, got {shown}")
    if wrong:
        raise AssertionError(f"run {run_id!r}: " + "; ".join(wrong))


async def assert_output(source: RunDetailSource, run_id: str, expected: Any) -> None:
    """The run completed with `expected` as its output (compared as stored JSON: a model or
    dataclass output is compared in its JSON form, so pass that form)."""
    detail = await _detail(source, run_id)
    run = detail.run
    if run.status != "completed":
        error = f" ({run.error.message})" if run.error is not None else ""
        raise AssertionError(
            f"run {run_id!r}: expected output {expected!r}, but the run is {run.status}{error}"
        )
    if run.output != expected:
        raise AssertionError(f"run {run_id!r}: expected output {expected!r}, got {run.output!r}")


async def assert_run_status(source: RunDetailSource, run_id: str, status: str) -> None:
    """The run's status is `status` (`"completed"`, `"failed"`, `"suspended"`, …)."""
    detail = await _detail(source, run_id)
    run = detail.run
    if run.status != status:
        error = f" ({run.error.message})" if run.error is not None else ""
        raise AssertionError(
            f"run {run_id!r}: expected status {status!r}, got {run.status!r}{error}"
        )
