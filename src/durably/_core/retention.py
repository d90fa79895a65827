"""Retention: which finished runs a policy prunes, and the checks made when it is declared.

A `RetentionPolicy` names terminal statuses and at least one bound. Within those statuses a
run is KEPT only while it satisfies every bound given and pruned once it breaks any:
`max_age` (its `updated_at`, ≈ when it finished, is older than `now - max_age`) and
`max_count` (it is not among the `max_count` most recently updated, ties by id).

One rule holds on every store: a finished parent whose child is still live is kept (the
child reports to it when it finishes), so pruning never orphans a live child's parent link.
Children name their parent with the engine-minted tag `PARENT_TAG_PREFIX + parent_id`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from durably._core.durations import Duration, to_ms_or_none
from durably._core.models import TERMINAL_RUN_STATUSES, RunStatus, WorkflowRun, ms_from_utc

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_SWEEP_INTERVAL_MS",
    "MAX_BATCHES_PER_POLICY",
    "PARENT_TAG_PREFIX",
    "PRUNE_ID_LIMIT",
    "PruneResult",
    "RetentionPolicy",
    "check_policies",
    "select_prunable",
]

#: Runs deleted per store call (one DELETE per table on SQL stores): bounds how long one
#: statement holds its locks, so a sweep never stalls the runs being driven meanwhile.
DEFAULT_BATCH_SIZE = 1000
#: A sweep at boot, then one every minute.
DEFAULT_SWEEP_INTERVAL_MS = 60_000
#: Batches per policy per sweep: a huge backlog drains over several sweeps, never one long one.
MAX_BATCHES_PER_POLICY = 100
#: How many run ids a `prune` result lists (the counts are always complete).
PRUNE_ID_LIMIT = 100
#: The tag a child run carries naming its parent (the engine's vocabulary, mirrored here
#: because stores sit below the engine).
PARENT_TAG_PREFIX = "durable:parent:"


@dataclass(frozen=True, init=False)
class RetentionPolicy:
    """Prune runs in `statuses` (terminal ones) older than `max_age` (a `timedelta`, a string
    such as "7d" or "90m", or seconds) and/or beyond the `max_count` most recent. Bad input
    raises `ValueError` naming the problem."""

    statuses: tuple[RunStatus, ...]
    max_age_ms: int | None = None
    max_count: int | None = None

    def __init__(
        self,
        statuses: Iterable[RunStatus] | RunStatus,
        max_age: Duration | None = None,
        max_count: int | None = None,
    ) -> None:
        given = (statuses,) if isinstance(statuses, str) else tuple(statuses)
        if not given:
            raise ValueError("RetentionPolicy: statuses must list at least one status")
        bad = [s for s in given if s not in TERMINAL_RUN_STATUSES]
        if bad:
            raise ValueError(
                f"RetentionPolicy: {', '.join(map(repr, bad))} is not a terminal status; "
                f"only finished runs are pruned ({', '.join(TERMINAL_RUN_STATUSES)})"
            )
        if len(set(given)) != len(given):
            raise ValueError("RetentionPolicy: a status is listed twice")
        if max_age is None and max_count is None:
            raise ValueError("RetentionPolicy: give max_age and/or max_count (no bound given)")
        try:
            age_ms = to_ms_or_none(max_age)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"RetentionPolicy: max_age={max_age!r} is not a duration") from exc
        if age_ms is not None and age_ms <= 0:
            raise ValueError(f"RetentionPolicy: max_age={max_age!r} must be positive")
        if max_count is not None and (
            isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 0
        ):
            raise ValueError(f"RetentionPolicy: max_count={max_count!r} must be an int >= 0")
        object.__setattr__(self, "statuses", given)
        object.__setattr__(self, "max_age_ms", age_ms)
        object.__setattr__(self, "max_count", max_count)


@dataclass(frozen=True)
class PruneResult:
    """What a prune deleted (or, `dry_run`, would delete): `count` runs, the first
    `PRUNE_ID_LIMIT` of their ids (oldest first), and how many store batches it took."""

    count: int
    run_ids: list[str] = field(default_factory=list)
    dry_run: bool = False
    batches: int = 0


def check_policies(policies: Sequence[RetentionPolicy] | RetentionPolicy) -> list[RetentionPolicy]:
    """The policies of `Engine(retention=...)`, each a `RetentionPolicy`, no status in two."""
    items = [policies] if isinstance(policies, RetentionPolicy) else list(policies)
    seen: dict[str, int] = {}
    for i, policy in enumerate(items):
        if not isinstance(policy, RetentionPolicy):
            raise ValueError(
                f"retention[{i}] is {type(policy).__name__}, not a durably.RetentionPolicy"
            )
        for status in policy.statuses:
            if status in seen:
                raise ValueError(
                    f"retention: status {status!r} is in policies {seen[status]} and {i}; "
                    "a status may appear in one policy only"
                )
            seen[status] = i
    return items


def select_prunable(
    runs: Iterable[WorkflowRun], policy: RetentionPolicy, now_ms: int, limit: int
) -> list[str]:
    """The reference selection over whole run rows (the memory store's; the SQL store
    writes the same as two SELECTs): up to `limit` ids, oldest first — first every run
    older than `max_age`, then those beyond the `max_count` most recent — skipping a run
    a live child names as its parent."""
    if limit <= 0:
        return []
    every = list(runs)
    live_parents = {
        tag[len(PARENT_TAG_PREFIX) :]
        for run in every
        if run.status not in TERMINAL_RUN_STATUSES
        for tag in run.tags or ()
        if tag.startswith(PARENT_TAG_PREFIX)
    }
    mine = [r for r in every if r.status in policy.statuses and r.id not in live_parents]
    chosen: dict[str, None] = {}
    if policy.max_age_ms is not None:
        cutoff = now_ms - policy.max_age_ms
        for run in sorted(mine, key=lambda r: (ms_from_utc(r.updated_at), r.id)):
            if ms_from_utc(run.updated_at) < cutoff:
                chosen[run.id] = None
    if policy.max_count is not None:
        newest = sorted(mine, key=lambda r: (ms_from_utc(r.updated_at), r.id), reverse=True)
        # the SQL store's `ORDER BY updated_at DESC OFFSET max_count LIMIT limit`, oldest first
        for run in reversed(newest[policy.max_count : policy.max_count + limit]):
            chosen.setdefault(run.id, None)
    return list(chosen)[:limit]
