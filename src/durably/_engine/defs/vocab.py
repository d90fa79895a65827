"""Small pure pieces several runtime modules share: the cancelled outcome, the tag that
names a child's parent, continuation ids, the check of a run priority and the completion a
failed run announces.

A leaf module (it imports nothing from the runtime), so the modules that settle, signal,
start children and act as the operator can all use it without importing each other.
"""

from __future__ import annotations

from typing import Any

from durably._core.models import StepError, WorkflowRun

CANCELLED = StepError(message="cancelled")
# Decision: a parent awaiting a cancelled child is told, so
# it fails loudly instead of waiting forever.
CANCELLED_COMPLETION = {"ok": False, "error": "cancelled", "code": "cancelled"}

PARENT_TAG_PREFIX = "durable:parent:"


def parent_tag(parent_run_id: str) -> str:
    """The engine-minted tag naming the run that started a child."""
    return PARENT_TAG_PREFIX + parent_run_id


def may_have_parent(run: WorkflowRun) -> bool:
    return "~retry~" in run.id or any(t.startswith(PARENT_TAG_PREFIX) for t in run.tags or ())


def next_continuation_id(run_id: str) -> str:
    """The id of the run `ctx.continue_as_new` starts: `<id>~1`, then `<id>~2`, …"""
    base, sep, n = run_id.rpartition("~")
    if sep and n.isdigit() and "~retry~" not in run_id[-(len(n) + 7) :]:
        return f"{base}~{int(n) + 1}"
    return f"{run_id}~1"


# A run's priority is stored in a 32-bit INTEGER column on PostgreSQL: refusing what does not
# fit at the call gives a clear error instead of a database error halfway through a start.
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1


def check_priority(priority: object, where: str) -> int | None:
    """A run priority as given (None: none), or ValueError naming the call. Higher runs
    first; bool is refused although it is an int, because `priority=True` is a mistake."""
    if priority is None:
        return None
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"{where}: priority must be an integer or None, not {priority!r}")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ValueError(
            f"{where}: priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}, not {priority}"
        )
    return priority


def completion_of_failure(error: StepError) -> dict[str, Any]:
    """The completion a failed run announces to its parent."""
    completion: dict[str, Any] = {"ok": False, "error": error.message}
    if error.code is not None:
        completion["code"] = error.code
    if error.details is not None:
        completion["details"] = error.details
    return completion
