"""What a start must pass: concurrency quotas, singleton back-pressure, dedup ids.

`start_gate` turns a workflow's registration (`concurrency=`, `singleton=`) and the start's
own options (`concurrency=`, `dedup_id=`) into the tags the run carries and a `StartGate`
the store checks in the same transaction as the insert (`StateStore.create_run_gated`); so
the count a quota compares and the insert it allows cannot be separated by another start of
the same key, in this process or any other. `refuse` turns the store's answer into the
error the caller sees. Both are used by `ControlPlane.create_run`, the path of every start
(`Engine.start`, `Client.start`, children, continuations, event starts), and by the creation
of a workflow fan's members when their workflow has a quota or a singleton queue depth
(`children.create_children`: one gated insert per member). Other fans' members are created
in bulk; a singleton member joins its key's line at its first turn (`singleton.admit`).
A start by name from a process without the workflow's code is checked at its first turn,
where the code is (`late_start`).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from durably._core.bounds import check_text
from durably._core.errors import (
    ConcurrencyLimitError,
    DuplicateRunError,
    DurablyError,
    RunIdConflictError,
    SingletonQueueFullError,
)
from durably._core.models import JSONValue, WorkflowRun
from durably._core.quota import (
    CONCURRENCY_TAG_PREFIX,
    SINGLETON_TAG_PREFIX,
    ConcurrencyQuota,
    StartGate,
    StartOutcome,
    concurrency_tag,
    count_statuses,
    singleton_tag,
)

if TYPE_CHECKING:
    from durably._engine.defs.registry import Workflow

__all__ = [
    "OnDuplicate",
    "PreparedStart",
    "RunIdInOtherNamespaceError",
    "check_existing_run",
    "check_start_options",
    "late_start",
    "refuse",
    "start_gate",
]

OnDuplicate = Literal["return", "raise"]


@dataclass(frozen=True, slots=True)
class PreparedStart:
    """The tags a start mints and the gate its insert must pass (None: a plain insert)."""

    tags: tuple[str, ...]
    gate: StartGate | None
    dedup_id: str | None = None
    quota_key: str | None = None
    quota_limit: int = 0
    singleton_key: str | None = None
    singleton_depth: int | None = None


def check_start_options(
    concurrency: ConcurrencyQuota | None, dedup_id: str | None, on_duplicate: str
) -> None:
    """Refuse a bad start option before anything is done."""
    if concurrency is not None and not isinstance(concurrency, ConcurrencyQuota):
        raise TypeError(
            f"concurrency= takes a durably.ConcurrencyQuota(key, limit), not {concurrency!r}"
        )
    if dedup_id is not None and (not isinstance(dedup_id, str) or not dedup_id):
        raise ValueError(f"dedup_id must be a non-empty string, not {dedup_id!r}")
    # Keys and ids reach the store's text columns (tags, dedup keys): a NUL or a lone
    # surrogate fails the store's write, so it is refused here, naming what holds it.
    if dedup_id is not None:
        check_text("dedup_id", dedup_id)
    if concurrency is not None:
        check_text("ConcurrencyQuota(key=...)", concurrency.key)
    if on_duplicate not in ("return", "raise"):
        raise ValueError(f'on_duplicate must be "return" or "raise", not {on_duplicate!r}')


def typed_input(workflow: Workflow[Any, Any], json_input: JSONValue) -> Any:
    """The input a key function receives: the body's typed value when the stored JSON
    fits the annotation, else the JSON itself (a start by name is validated later)."""
    try:
        return workflow.input_codec.from_json(json_input)
    except Exception:
        return json_input


def _key(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise TypeError(f"{where}: the key function must return a non-empty str or None")
    return check_text(f"{where}: the key", value)


async def _limit(config_limit: Any, key: str, where: str) -> int:
    limit = config_limit(key) if callable(config_limit) else config_limit
    if inspect.isawaitable(limit):
        limit = await limit
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"{where}: the limit must be an int, not {limit!r}")
    return limit


def singleton_key(workflow: Workflow[Any, Any], json_input: JSONValue) -> str | None:
    """The singleton key of a run of `workflow` with that input (None: not serialised)."""
    config = workflow.singleton
    if config is None:
        return None
    return _key(config.key(typed_input(workflow, json_input)), f"singleton of {workflow.name}")


async def start_gate(
    workflow: Workflow[Any, Any] | None,
    json_input: JSONValue,
    *,
    name: str,
    namespace: str,
    concurrency: ConcurrencyQuota | None,
    dedup_id: str | None,
) -> PreparedStart:
    """The minted tags and the store gate of one start (raises what a key or limit
    function raises: the start is refused and nothing is created)."""
    minted: list[str] = []
    s_key: str | None = None
    depth: int | None = None
    capacity: int | None = None
    if workflow is not None and workflow.singleton is not None:
        s_key = singleton_key(workflow, json_input)
        if s_key is not None:
            minted.append(singleton_tag(s_key))
            depth = workflow.singleton.max_queue_depth
            if depth is not None:
                capacity = workflow.singleton.limit + depth
    q_key: str | None = None
    q_limit = 0
    statuses = count_statuses(None, name)
    where = f"concurrency of {name}"
    if concurrency is not None:  # the start's own quota overrides the registration's
        q_key, q_limit = concurrency.key, concurrency.limit
        statuses = count_statuses(concurrency.count_statuses, where)
    elif workflow is not None and workflow.concurrency is not None:
        config = workflow.concurrency
        q_key = _key(config.key(typed_input(workflow, json_input)), where)
        if q_key is not None:
            q_limit = await _limit(config.limit, q_key, where)
            statuses = count_statuses(config.count_statuses, where)
    if q_key is not None:
        minted.append(concurrency_tag(q_key))
    dedup_key = None if dedup_id is None else json.dumps([namespace, name, dedup_id])
    gate = None
    if dedup_key is not None or capacity is not None or q_key is not None:
        gate = StartGate(
            dedup_key=dedup_key,
            singleton_tag=singleton_tag(s_key) if s_key is not None else None,
            singleton_workflow=name,
            singleton_capacity=capacity,
            quota_tag=concurrency_tag(q_key) if q_key is not None else None,
            quota_limit=q_limit,
            quota_statuses=statuses,
        )
    return PreparedStart(
        tags=tuple(minted),
        gate=gate,
        dedup_id=dedup_id,
        quota_key=q_key,
        quota_limit=q_limit,
        singleton_key=s_key,
        singleton_depth=depth,
    )


class RunIdInOtherNamespaceError(RunIdConflictError):
    """A start asked for a run id another namespace's run already holds.

    Run ids are unique across namespaces, so such an id can never be this start's run:
    returning the existing run would hand the caller another tenant's run (its output, its
    signals), and doing nothing would tell it the start succeeded. The message names neither
    the other namespace nor its workflow: both belong to someone else."""

    def __init__(self, run_id: str, requested_workflow: str):
        DurablyError.__init__(
            self,
            f"run id {run_id!r} is already taken by a run in another namespace; "
            f"it cannot be used to start {requested_workflow!r} here",
        )
        self.run_id = run_id
        self.existing_workflow = ""
        self.requested_workflow = requested_workflow


def check_existing_run(existing: WorkflowRun, *, name: str, namespace: str) -> None:
    """A start found a run holding its id: it is that start's run (an idempotent start)
    only when it is of the same workflow in the same namespace; otherwise the start is
    refused with a `RunIdConflictError`."""
    if (existing.namespace or "default") != namespace:
        raise RunIdInOtherNamespaceError(existing.id, name)
    if existing.workflow != name:
        raise RunIdConflictError(existing.id, existing.workflow, name)


async def late_start(workflow: Workflow[Any, Any], run: WorkflowRun) -> PreparedStart | None:
    """The checks a start by name skipped, for the first turn of `run` (still `pending`).

    A process without the workflow's code (`Client(store).start("name", input)`) cannot run
    its key functions, so its start checked neither the workflow's concurrency quota nor its
    singleton `max_queue_depth`. The worker that takes the run has the code: it computes the
    keys now and the store checks them and adds the tags in one transaction
    (`StateStore.gate_untagged_run`), exactly as a start would have. A run that carries a
    `concurrency:` tag was gated at its start (by the workflow's key, or by its own
    `ConcurrencyQuota`), one with a `singleton:` tag likewise; a key function answering None
    limits nothing. None: nothing to check. An input that does not fit the body is not
    checked here (its first turn fails it with `InputValidationError`).

    Decision: a run over the limit at that point is failed with the error the start would
    have raised (`ConcurrencyLimitError`, `SingletonQueueFullError`) as the run's error —
    never parked: the limit is a refusal at start, and a run that waits for room would be a
    queue nobody asked for. Raises what a key or limit function raises (the caller fails
    the run with it)."""
    tags = run.tags or ()
    need_quota = workflow.concurrency is not None and not any(
        t.startswith(CONCURRENCY_TAG_PREFIX) for t in tags
    )
    config = workflow.singleton
    need_depth = (
        config is not None
        and config.max_queue_depth is not None
        and not any(t.startswith(SINGLETON_TAG_PREFIX) for t in tags)
    )
    if not (need_quota or need_depth):
        return None
    try:
        typed = workflow.input_codec.from_json(run.input)
    except Exception:
        return None
    minted: list[str] = []
    s_key: str | None = None
    capacity: int | None = None
    if need_depth:
        assert config is not None and config.max_queue_depth is not None
        s_key = _key(config.key(typed), f"singleton of {workflow.name}")
        if s_key is not None:
            minted.append(singleton_tag(s_key))
            capacity = config.limit + config.max_queue_depth
    q_key: str | None = None
    q_limit = 0
    statuses = count_statuses(None, workflow.name)
    if need_quota:
        quota = workflow.concurrency
        assert quota is not None
        where = f"concurrency of {workflow.name}"
        q_key = _key(quota.key(typed), where)
        if q_key is not None:
            q_limit = await _limit(quota.limit, q_key, where)
            statuses = count_statuses(quota.count_statuses, where)
            minted.append(concurrency_tag(q_key))
    if capacity is None and q_key is None:
        return None
    gate = StartGate(
        singleton_tag=singleton_tag(s_key) if capacity is not None and s_key else None,
        singleton_workflow=workflow.name,
        singleton_capacity=capacity,
        quota_tag=concurrency_tag(q_key) if q_key is not None else None,
        quota_limit=q_limit,
        quota_statuses=statuses,
    )
    return PreparedStart(
        tags=tuple(minted),
        gate=gate,
        quota_key=q_key,
        quota_limit=q_limit,
        singleton_key=s_key,
        singleton_depth=config.max_queue_depth if config is not None else None,
    )


def refuse(
    outcome: StartOutcome,
    prepared: PreparedStart,
    *,
    name: str,
    run_id: str,
    on_duplicate: OnDuplicate,
) -> str:
    """The id a start returns for the store's answer, or the error that refuses it. An
    `exists` of the same workflow is returned as it is: the caller checks that run's
    namespace (`check_existing_run`), which the store's answer does not carry."""
    verdict = outcome.verdict
    if verdict == "created":
        return run_id
    if verdict == "exists":
        if outcome.holder != name:
            raise RunIdConflictError(run_id, str(outcome.holder), name)
        return run_id
    if verdict == "duplicate":
        assert outcome.holder is not None and prepared.dedup_id is not None
        if on_duplicate == "raise":
            raise DuplicateRunError(name, prepared.dedup_id, outcome.holder)
        return outcome.holder
    if verdict == "singleton_full":
        assert prepared.singleton_key is not None and prepared.singleton_depth is not None
        raise SingletonQueueFullError(name, prepared.singleton_key, prepared.singleton_depth)
    assert prepared.quota_key is not None
    raise ConcurrencyLimitError(name, prepared.quota_key, prepared.quota_limit, outcome.active)
