"""Workflow-level start admission: concurrency quotas, singleton keys and dedup ids.

The data both the engine and the stores use. The engine resolves a workflow's options into a
`StartGate` (plain strings and numbers); the store checks the gate and inserts the run in ONE
transaction (`StateStore.create_run_gated`), so a count and the insert it allows cannot be
separated by another start of the same key. Each turn of a singleton run asks the store to
admit it (`try_admit_singleton`), again in one transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from durably._core.models import DEFAULT_CONCURRENCY_STATUSES, RUN_STATUSES, RunStatus

__all__ = [
    "CONCURRENCY_TAG_PREFIX",
    "SINGLETON_ACTIVE_STATUSES",
    "SINGLETON_ADMITTED_TAG",
    "SINGLETON_TAG_PREFIX",
    "Concurrency",
    "ConcurrencyQuota",
    "Singleton",
    "StartGate",
    "StartOutcome",
    "concurrency_tag",
    "count_statuses",
    "singleton_admits",
    "singleton_line",
    "singleton_lock_key",
    "singleton_tag",
]

#: Held by a singleton run admitted to run its body (one of the key's `limit` holders). Only
#: the store writes it (callers' tags are stripped of it); a manual retry drops it, and a
#: run that is no longer active does not count as a holder, whatever its tags say.
SINGLETON_ADMITTED_TAG = "durable:singleton:admitted"
SINGLETON_TAG_PREFIX = "singleton:"
CONCURRENCY_TAG_PREFIX = "concurrency:"

#: A singleton run in one of these holds its place in the key's line (or a slot).
SINGLETON_ACTIVE_STATUSES: tuple[RunStatus, ...] = (
    "pending",
    "running",
    "suspended",
    "blocked",
    "cancelling",
)


def singleton_tag(key: str) -> str:
    return f"{SINGLETON_TAG_PREFIX}{key}"


def concurrency_tag(key: str) -> str:
    return f"{CONCURRENCY_TAG_PREFIX}{key}"


def count_statuses(given: Sequence[str] | None, where: str) -> tuple[RunStatus, ...]:
    """The statuses a quota counts (default: every live status); a bad one is refused."""
    if given is None:
        return DEFAULT_CONCURRENCY_STATUSES
    if isinstance(given, str):
        raise TypeError(f"{where}: count_statuses must be a list of statuses, not a string")
    out: list[RunStatus] = []
    for status in given:
        if status not in RUN_STATUSES:
            raise ValueError(
                f"{where}: unknown status {status!r} in count_statuses "
                f"(one of {', '.join(RUN_STATUSES)})"
            )
        out.append(status)
    if not out:
        raise ValueError(f"{where}: count_statuses must name at least one status")
    return tuple(dict.fromkeys(out))


Limit = int | Callable[[str], int | Awaitable[int]]


@dataclass(frozen=True, slots=True)
class Concurrency:
    """`@durably.workflow(concurrency=Concurrency(key=..., limit=...))`: at most `limit` runs
    of one key in flight; a start beyond it raises `ConcurrencyLimitError` (nothing created).

    `key(input)` names the key (None: this start is not limited); the key is shared by every
    workflow that uses it. `limit` is a number or `limit(key)` (sync or async), asked at each
    start. `count_statuses` says which runs count (default: every live one — pending,
    running, suspended, cancelling, blocked); `["pending", "running"]` frees the slots of
    runs parked on a human.
    """

    key: Callable[[Any], str | None]
    limit: Limit
    count_statuses: Sequence[RunStatus] | None = None

    def __post_init__(self) -> None:
        if not callable(self.key):
            raise TypeError("Concurrency(key=...) must be a function of the input")
        _check_limit(self.limit, "Concurrency")
        count_statuses(self.count_statuses, "Concurrency")


@dataclass(frozen=True, slots=True)
class ConcurrencyQuota:
    """`start(..., concurrency=ConcurrencyQuota(key, limit))`: the quota of this one start,
    instead of the workflow's `Concurrency` (same rules, a fixed key and limit)."""

    key: str
    limit: int
    count_statuses: Sequence[RunStatus] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError("ConcurrencyQuota(key=...) must be a non-empty string")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise TypeError(f"ConcurrencyQuota(limit=...) must be an int, not {self.limit!r}")
        count_statuses(self.count_statuses, "ConcurrencyQuota")


@dataclass(frozen=True, slots=True)
class Singleton:
    """`@durably.workflow(singleton=Singleton(key=..., limit=1, max_queue_depth=None))`: at
    most `limit` runs of one key execute their bodies at once; the others wait, admitted in
    the order they were created. `key(input)` names the key (per workflow). With
    `max_queue_depth`, a start that would make more than `limit + max_queue_depth` runs of
    the key active raises `SingletonQueueFullError` (nothing created)."""

    key: Callable[[Any], str]
    limit: int = 1
    max_queue_depth: int | None = None

    def __post_init__(self) -> None:
        if not callable(self.key):
            raise TypeError("Singleton(key=...) must be a function of the input")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"Singleton(limit=...) must be a positive int, not {self.limit!r}")
        depth = self.max_queue_depth
        if depth is not None and (
            isinstance(depth, bool) or not isinstance(depth, int) or depth < 0
        ):
            raise ValueError(
                f"Singleton(max_queue_depth=...) must be None or an int >= 0, not {depth!r}"
            )


def _check_limit(limit: Any, where: str) -> None:
    if callable(limit):
        return
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"{where}(limit=...) must be an int or a function of the key")


@dataclass(frozen=True, slots=True)
class StartGate:
    """What a start must pass before its run is inserted (checked in the same transaction).

    - `dedup_key`: no LIVE run may hold it (a terminal holder frees it);
    - `singleton_tag` + `singleton_workflow` + `singleton_capacity`: fewer than `capacity`
      active runs of the workflow carry the tag (None: no back-pressure);
    - `quota_tag`: fewer than `quota_limit` runs (any workflow) carry the tag with a status
      in `quota_statuses`; a limit of 0 or less refuses every start.
    """

    dedup_key: str | None = None
    singleton_tag: str | None = None
    singleton_workflow: str | None = None
    singleton_capacity: int | None = None
    quota_tag: str | None = None
    quota_limit: int = 0
    quota_statuses: tuple[RunStatus, ...] = DEFAULT_CONCURRENCY_STATUSES

    @property
    def lock_keys(self) -> list[str]:
        """The keys a store serialises this start on (sorted: two gates never deadlock)."""
        keys = []
        if self.dedup_key is not None:
            keys.append(f"durably:dedup:{self.dedup_key}")
        if self.singleton_tag is not None and self.singleton_capacity is not None:
            keys.append(singleton_lock_key(self.singleton_workflow or "", self.singleton_tag))
        if self.quota_tag is not None:
            keys.append(f"durably:quota:{self.quota_tag}")
        return sorted(keys)


def singleton_lock_key(workflow: str, tag: str) -> str:
    return f"durably:singleton:{workflow}:{tag}"


StartVerdict = Literal["created", "exists", "duplicate", "singleton_full", "quota_full"]


@dataclass(frozen=True, slots=True)
class StartOutcome:
    """The store's answer to a gated start.

    `created`: inserted. `exists`: a run with that id exists (`holder` = its workflow; an
    idempotent start, never refused). `duplicate`: a live run holds the dedup key
    (`holder` = its id). `singleton_full` / `quota_full`: refused, `active` runs counted.
    """

    verdict: StartVerdict
    holder: str | None = None
    active: int = 0


def singleton_line(
    active: Sequence[tuple[str, str, bool]], limit: int
) -> tuple[set[str], list[str]]:
    """The key's holders and the waiters whose turn it is, from its ACTIVE runs as `(id,
    status, holds the marker)` in creation order (`created_at`, then id): the first
    `limit - holders` runs not holding a slot are next. The one rule every store applies."""
    holders = {run_id for run_id, _, held in active if held}
    free = limit - len(holders)
    if free <= 0:
        return holders, []
    waiters = [run_id for run_id, _, held in active if not held]
    return holders, waiters[:free]


def singleton_admits(run_id: str, active: Sequence[tuple[str, str, bool]], limit: int) -> bool:
    """Whether the active run `run_id` may run its body now (see `singleton_line`). A run
    that is not active is never admitted, nor is one being cancelled that holds no slot."""
    status = next((s for rid, s, _ in active if rid == run_id), None)
    if status is None:
        return False
    holders, nxt = singleton_line(active, limit)
    if run_id in holders:
        return True
    return status != "cancelling" and run_id in nxt
