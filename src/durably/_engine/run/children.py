"""Children at scale: bulk starts and batched completion delivery.

* `register_waits` / `create_children`: a fan wave registers every member's waiter and
  placeholder, then creates every child run, with multi-row statements (O(N / chunk) round
  trips). Children are created `pending` and picked up by the claim loop (`Poller.run_pending`),
  so several engines sharing the database split a wide fan between them.
* `ChildMailbox`: a finished child's completion is queued per parent; one drain per parent
  delivers the queued completions with ONE `deliver_signals` transaction per batch, then wakes
  the parent at most once per batch. A parent that is not resident here is re-driven only when
  the fan's join barrier opens: no member of the fan is still `running` (a failed
  completion always opens it). So a parent waiting on N children costs O(N) store work in
  total, never O(N²), and one replay per settled wave at most.

The bulk store methods (`register_child_waits`, `create_runs`, `deliver_signals`) are part
of the store contract: every store has them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from durably._core.ids import validate_run_id
from durably._core.log_context import durably_logger
from durably._core.models import (
    ChildWait,
    JSONValue,
    RunQuery,
    RunStatus,
    StepCheckpoint,
    WorkflowRun,
    now_utc,
    replace,
    utc_from_ms,
)
from durably._engine.defs.registry import Workflow
from durably._engine.defs.vocab import next_continuation_id, parent_tag
from durably._engine.flow import quotas
from durably._store.protocol import AdmissionStore, RunStore, SignalStore

if TYPE_CHECKING:
    from durably._engine.run.execution import Execution
    from durably._engine.run.host import RunHost

log = durably_logger("durably.engine")


# ------------------------------------------------------------------ store calls


class GatedStarts(RunStore, AdmissionStore, Protocol):
    """What starting a fan's members one by one through their keys' gates needs."""


async def register_waits(store: SignalStore, waits: Sequence[ChildWait]) -> None:
    await store.register_child_waits(waits)


async def _create_runs(store: RunStore, new_runs: Sequence[WorkflowRun]) -> list[str | None]:
    result: list[str | None] = await store.create_runs(new_runs)
    return result


async def deliver_signals(
    store: SignalStore, payloads: Sequence[tuple[str, JSONValue]], at: datetime
) -> list[StepCheckpoint]:
    written: list[StepCheckpoint] = await store.deliver_signals(payloads, at)
    return written


# ------------------------------------------------------------------ bulk child start


def _limited(wf: Workflow[Any, Any]) -> bool:
    """Whether each start of `wf` must pass its concurrency quota or singleton queue depth
    (a fan's members then start one by one, as single starts would)."""
    singleton_depth = wf.singleton is not None and wf.singleton.max_queue_depth is not None
    return wf.concurrency is not None or singleton_depth


async def _create_gated(
    store: GatedStarts,
    wf: Workflow[Any, Any],
    new_runs: Sequence[WorkflowRun],
    failed: dict[str, str],
) -> list[str | None]:
    """Create members one by one through the store's gated insert, as `ctx.child` would start
    each: a member over its key's quota (or its singleton line's depth) is not created, and
    its reason goes to `failed` (the parent's wait sees it as that member's failure). Slower
    than the multi-row insert, so only fans of such workflows take it. Returns, per run, the
    workflow of a run that held its id (None: created or refused)."""
    holders: list[str | None] = []
    for run in new_runs:
        try:
            prepared = await quotas.start_gate(
                wf,
                run.input,
                name=wf.name,
                namespace=run.namespace or "default",
                concurrency=None,
                dedup_id=None,
            )
        except Exception as exc:  # a key or limit function that fails refuses this member
            failed[run.id] = str(exc)
            holders.append(None)
            continue
        if prepared.gate is None:  # no key for this input: not limited
            holders.extend(await _create_runs(store, [run]))
            continue
        tags = tuple(dict.fromkeys([*(run.tags or ()), *prepared.tags]))
        outcome = await store.create_run_gated(replace(run, tags=tags), prepared.gate)
        if outcome.verdict in ("created", "exists"):
            holders.append(outcome.holder if outcome.verdict == "exists" else None)
            continue
        try:
            quotas.refuse(outcome, prepared, name=wf.name, run_id=run.id, on_duplicate="raise")
        except Exception as exc:
            failed[run.id] = str(exc)
        holders.append(None)
    return holders


async def create_children(
    host: RunHost,
    workflow: Workflow[Any, Any] | str,
    members: Sequence[tuple[str, Any]],
    parent: WorkflowRun,
    priority: int | None = None,
) -> list[str]:
    """Create the child runs `(child_id, input)` that do not exist yet (only if absent, so a
    replayed launch is idempotent). A member that cannot start (unknown workflow, invalid
    input, its id held by another workflow, refused by its workflow's quota or singleton
    queue depth) gets its failed Completion delivered to the parent like any child result.
    Returns the ids that existed before this call.

    Members carry `priority`, else their parent's: work done on behalf of an urgent run is
    as urgent as the run itself, so a fan never falls behind the backlog its parent jumped."""
    name = workflow.name if isinstance(workflow, Workflow) else workflow
    member_priority = priority if priority is not None else parent.priority
    failed: dict[str, str] = {}
    new_runs: list[WorkflowRun] = []
    try:
        wf = host.resolve(workflow, None)
    except Exception as exc:
        failed = {child_id: str(exc) for child_id, _ in members}
    else:
        now = now_utc()
        tags = tuple(dict.fromkeys([*wf.tags, parent_tag(parent.id)]))
        for child_id, input in members:
            try:
                # A member id derived from a long parent id can break the id rule: that
                # member fails to start, clearly, like one with an invalid input.
                validate_run_id(child_id, what="fan member run id")
                json_input = host.prepare_input(wf, input)
            except Exception as exc:
                failed[child_id] = str(exc)
                continue
            new_runs.append(
                WorkflowRun(
                    id=child_id,
                    workflow=wf.name,
                    workflow_version=wf.version,
                    status="pending",
                    input=json_input,
                    tags=tags,
                    namespace=parent.namespace or host.namespace or "default",
                    priority=member_priority,
                    created_at=now,
                    updated_at=now,
                )
            )
    existed: list[str] = []
    if new_runs:
        # (new runs exist only when the workflow resolved: `wf` is bound here)
        if _limited(wf):
            holders = await _create_gated(host.store, wf, new_runs, failed)
        else:
            holders = await _create_runs(host.store, new_runs)
        for run, holder in zip(new_runs, holders, strict=True):
            if run.id in failed:
                continue  # refused by its quota or queue depth
            if holder is None:
                host.run_created_here(run.id)
            elif holder != run.workflow:
                failed[run.id] = (
                    f"run id {run.id} is already used by workflow {holder!r}, not {run.workflow!r}"
                )
            else:
                existed.append(run.id)
        if len(existed) + len(failed) < len(members):
            await host.children_created(new_runs[0].id)
    for child_id, error in failed.items():
        message = f'child workflow "{name}" failed to start: {error}'
        host.post_completion(parent.id, child_id, {"ok": False, "error": message})
    return existed


def adoptable(
    existing: WorkflowRun | None, workflow: Workflow[Any, Any] | str, parent: WorkflowRun
) -> bool:
    """Whether a run found under a child's id (`ctx.child(..., id=…)`) is that child: of the
    same workflow, in the parent's namespace. Anything else must not be adopted (its output
    would reach this parent: another tenant's run, under an id this workflow chose); the
    child's start is attempted instead and refused as a run id conflict, which fails the
    parent's wait with that reason."""
    if existing is None:
        return False
    name = workflow.name if isinstance(workflow, Workflow) else workflow
    return existing.workflow == name and _same_namespace(existing, parent)


def _same_namespace(run: WorkflowRun, parent: WorkflowRun) -> bool:
    return (run.namespace or "default") == (parent.namespace or "default")


def check_continuation_id(run_id: str) -> None:
    """`ctx.continue_as_new` of run `run_id`: refuse now when the id of the next run
    (`<id>~<n>`) would break the id rule. The run is completed before its continuation is
    started, so a refusal at that start would lose the continuation; refused here, the run
    fails with the reason instead."""
    validate_run_id(next_continuation_id(run_id), what="continuation run id")


# ------------------------------------------------------------------ batched completions


def fan_span(group: str | None) -> tuple[int, int] | None:
    """The seq range `(first, last)` of a fan group `all:<first>:<total>[:ff]`;
    None for the plain legacy form (its size is unknown)."""
    if not group or not group.startswith("all:"):
        return None
    parts = group.split(":")
    try:
        first, total = int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        return None
    return first, first + total - 1


# ------------------------------------------------------------------ lost completions


_PARENT_TERMINAL: tuple[RunStatus, ...] = ("completed", "failed", "dead", "cancelled")


def completion_of_run(run: WorkflowRun) -> dict[str, Any] | None:
    """The Completion a finished child announces (settle.settle_terminal, operator.cancel_with),
    rebuilt from its run row; None while it is not finished for its parent."""
    if run.status == "completed":
        return {"ok": True, "value": run.output}
    if run.status not in _PARENT_TERMINAL:
        return None
    if run.error is None:
        if run.status == "cancelled":
            return {"ok": False, "error": "cancelled", "code": "cancelled"}
        return {"ok": False, "error": f"child run {run.id} {run.status}"}
    completion: dict[str, Any] = {"ok": False, "error": run.error.message}
    if run.error.code is not None:
        completion["code"] = run.error.code
    if run.error.details is not None:
        completion["details"] = run.error.details
    return completion


async def recover_completions(ex: Execution, members: dict[str, int]) -> list[StepCheckpoint]:
    """Deliver the completion of every child in `members` (child id → the parent's seq)
    that already finished although the parent's row still waits for it.

    A child announces its completion after its settle commits; a crash in between loses
    the announcement (nothing re-sends it: the child is terminal, so recovery skips it).
    The child's run row is the source of truth, so a parent that re-reads its waits (a
    replay, or a re-check wake) asks the children themselves (found by
    tests/faults/test_fan_faults.py). One tag query for many members, else one read each."""
    if not members:
        return []
    store = ex.store
    finished: list[WorkflowRun] = []
    if len(members) > 16:
        query = RunQuery(tag=parent_tag(ex.run_id), statuses=list(_PARENT_TERMINAL))
        finished = [run for run in await store.list_runs(query) if run.id in members]
    else:
        for child_id in members:
            run = await store.get_run(child_id)
            if run is not None and run.status in _PARENT_TERMINAL:
                finished.append(run)
    # A run of another namespace under a member's id is never this parent's child.
    finished = [run for run in finished if _same_namespace(run, ex.run)]
    payloads: list[tuple[str, JSONValue]] = []
    for run in finished:
        completion = completion_of_run(run)
        if completion is not None:
            payloads.append((f"child:{run.id}", completion))
    if not payloads:
        return []
    written = await deliver_signals(store, payloads, utc_from_ms(ex.host.clock()))
    for cp in written:
        ex.snapshot[cp.seq] = cp
    return written
