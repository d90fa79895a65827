"""Row builders for the read-side tests (no hypothesis needed).

Checkpoints look like the engine's: `signal:child:<id>` placeholders (running) and
completions (completed, output = Completion), folded `fan:<P>` rows, `spawn:<id>`
rows, step-fan members, ungrouped steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from durably import StepCheckpoint
from durably._core.models import CheckpointKind, CheckpointStatus
from durably._read.vocabulary import checkpoint_name_kind

RUN = "r"
T0 = datetime(2026, 6, 11, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def row(
    seq: int,
    name: str,
    *,
    status: CheckpointStatus = "completed",
    kind: CheckpointKind = "remote",
    group: str | None = None,
    output: Any = None,
    attempts: int = 1,
    enqueued: float | None = None,
    started: float | None = None,
    finished: float | None = None,
    run_id: str = RUN,
) -> StepCheckpoint:
    start = at(started if started is not None else seq)
    return StepCheckpoint(
        run_id=run_id,
        seq=seq,
        name=name,
        kind=kind,
        step_id=f"{run_id}:{seq}",
        status=status,
        started_at=start,
        finished_at=at(finished) if finished is not None else start + timedelta(seconds=1),
        attempts=attempts,
        output=output,
        parallel_group=group,
        enqueued_at=at(enqueued) if enqueued is not None else None,
    )


def step(
    seq: int, name: str = "charge", status: CheckpointStatus = "completed", **kw: Any
) -> StepCheckpoint:
    return row(seq, name, status=status, **kw)


def ok(value: Any = None) -> dict[str, Any]:
    return {"ok": True, "value": value}


def err(error: str = "boom", code: str | None = None, details: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": False, "error": error}
    if code is not None:
        out["code"] = code
    if details is not None:
        out["details"] = details
    return out


def child(
    seq: int, child_id: str, completion: Any = None, *, group: str | None = None, **kw: Any
) -> StepCheckpoint:
    """A `signal:child:` row: a running placeholder when `completion` is None."""
    name = f"signal:child:{child_id}"
    if completion is None:
        return row(seq, name, status="running", kind="signal", group=group, **kw)
    return row(seq, name, kind="signal", group=group, output=completion, **kw)


def folded(
    seq: int,
    prefix: str,
    first: int,
    completions: Sequence[Any],
    *,
    group: str | None = None,
    count: Any = None,
    **kw: Any,
) -> StepCheckpoint:
    output = {
        "first": first,
        "count": len(completions) if count is None else count,
        "completions": list(completions),
    }
    return row(seq, f"fan:{prefix}", kind="signal", group=group, output=output, **kw)


def spawn(seq: int, child_id: Any, **kw: Any) -> StepCheckpoint:
    return row(seq, f"spawn:{child_id}", kind="local", output=child_id, **kw)


def stats_of(rows: Iterable[StepCheckpoint], group: str | None = None) -> list[dict[str, Any]]:
    """Test-local copy of `durably._core.aggregates.checkpoint_stats_of` (camelCase bucket
    mappings), so the ETag tests do not depend on the store package."""
    buckets: dict[tuple[str | None, str, str], list[StepCheckpoint]] = {}
    for cp in rows:
        if group is not None and cp.parallel_group != group:
            continue
        key = (cp.parallel_group, cp.status, checkpoint_name_kind(cp.name))
        buckets.setdefault(key, []).append(cp)
    out = []
    for (g, status, kind), cps in buckets.items():
        out.append(
            {
                "group": g,
                "status": status,
                "nameKind": kind,
                "count": len(cps),
                "minSeq": min(c.seq for c in cps),
                "maxSeq": max(c.seq for c in cps),
                "minName": min(c.name for c in cps),
                "maxName": max(c.name for c in cps),
                "minEnqueuedAt": min(c.enqueued_at or c.started_at for c in cps),
                "minStartedAt": min(c.started_at for c in cps),
                "maxStartedAt": max(c.started_at for c in cps),
                "maxFinishedAt": max(c.finished_at for c in cps),
                "sumAttempts": sum(c.attempts for c in cps),
            }
        )
    return out
