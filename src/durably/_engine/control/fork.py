"""Forking a settled run from a step: the part of `Client.fork` that reads and copies rows.

A fork is a NEW run of the same workflow whose checkpoints before `from_seq` are copies of
the original's, so its replay takes those steps' recorded results instead of running them
again and executes from `from_seq` on with the code deployed now. The original is never
written to.

Which rows are copied: every row with `seq < from_seq` whose status is settled
(`completed` or `failed`), as it is, under the new run id. A row still waiting (`pending`,
`running`, a timer or a signal wait not delivered) is not copied: the fork's replay reaches
that point and waits again. A child's completion row (`signal:child:<id>`) is a settled row
like any other, so a completed child's result is reused and the child run is not started
again. The engine's handoff rows (an `on_error` handler's) are never copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from durably._core.models import HANDOFF_SEQ_BASE, StepCheckpoint, WorkflowRun, replace

if TYPE_CHECKING:
    from durably._store.protocol import StateStore

__all__ = [
    "FORKABLE_STATUSES",
    "FORKED_FROM_TAG",
    "check_forkable",
    "copy_checkpoints",
    "default_fork_id",
    "fork_tag",
    "fork_tags",
    "rows_to_copy",
]

# Only a settled run is forked: a live one is still writing the rows a fork would copy.
FORKABLE_STATUSES = ("completed", "failed", "cancelled", "dead")

# The tags that link a fork to its original: `forked-from:<run id>@<seq>` (which run, from
# which step) and `forked-from:<run id>` (so `list_runs(tags=[...])` finds every fork of a
# run, whatever its step: tags match exactly). Both are shown in the run's detail; the
# console's run page links a fork to its original and the original to its forks.
FORKED_FROM_TAG = "forked-from:"


def fork_tag(run_id: str, from_seq: int) -> str:
    return f"{FORKED_FROM_TAG}{run_id}@{from_seq}"


def fork_tags(inherited: list[str], run_id: str, from_seq: int) -> tuple[str, ...]:
    """A fork's tags: the original's (minus its own `forked-from:` links — a fork of a fork
    names its direct original only) and the two links to `run_id`."""
    kept = [t for t in inherited if not t.startswith(FORKED_FROM_TAG)]
    return (*kept, f"{FORKED_FROM_TAG}{run_id}", fork_tag(run_id, from_seq))


def default_fork_id(run_id: str, from_seq: int) -> str:
    """`<run_id>~fork~<from_seq>`: a deterministic id, so forking the same run from the
    same step twice returns the first fork."""
    return f"{run_id}~fork~{from_seq}"


def check_forkable(run: WorkflowRun, cps: list[StepCheckpoint], from_seq: int) -> None:
    """`ValueError` naming why `run` cannot be forked from `from_seq`."""
    if run.status not in FORKABLE_STATUSES:
        raise ValueError(
            f"run {run.id!r} is {run.status}: only a settled run "
            f"({', '.join(FORKABLE_STATUSES)}) can be forked"
        )
    if isinstance(from_seq, bool) or not isinstance(from_seq, int):
        raise TypeError(f"from_seq must be an int, not {from_seq!r}")
    last = max((cp.seq for cp in cps if cp.seq < HANDOFF_SEQ_BASE), default=-1)
    if not 0 <= from_seq <= last + 1:
        raise ValueError(
            f"from_seq={from_seq} is out of range for run {run.id!r}: its steps are "
            f"seq 0..{last} (from_seq may be 0..{last + 1})"
        )


def rows_to_copy(cps: list[StepCheckpoint], from_seq: int, new_id: str) -> list[StepCheckpoint]:
    return [
        replace(cp, run_id=new_id)
        for cp in cps
        if cp.seq < from_seq and cp.status in ("completed", "failed")
    ]


async def copy_checkpoints(store: StateStore, rows: list[StepCheckpoint]) -> None:
    """Write the copied rows in one bulk upsert (one transaction, a statement per chunk;
    a fork asked again after a crash writes the same rows again)."""
    await store.save_checkpoints(rows)
