"""`prune(policy)`: a retention policy applied once, in bounded batches, or counted (dry run).

Each batch is one store call (`prune_terminal_runs`, one transaction deleting at most
`batch_size` runs with their rows); batches follow each other, never overlap, and stop when
one comes back short or after `MAX_BATCHES_PER_POLICY`, so a backlog larger than that drains
over several calls instead of one long one. A dry run selects the same runs without deleting
(counted up to `batch_size * MAX_BATCHES_PER_POLICY`). The clock is read once per prune.
"""

from __future__ import annotations

from durably._core.retention import (
    DEFAULT_BATCH_SIZE,
    MAX_BATCHES_PER_POLICY,
    PRUNE_ID_LIMIT,
    PruneResult,
    RetentionPolicy,
)
from durably._store.protocol import RetentionStore

__all__ = ["prune"]


async def prune(
    store: RetentionStore,
    policy: RetentionPolicy,
    now_ms: int,
    *,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_batches: int = MAX_BATCHES_PER_POLICY,
) -> PruneResult:
    if not isinstance(policy, RetentionPolicy):
        raise TypeError(f"prune: policy is {type(policy).__name__}, not a RetentionPolicy")
    if batch_size <= 0:
        raise ValueError(f"prune: batch_size={batch_size!r} must be positive")
    if dry_run:
        ids = await store.prune_terminal_runs(
            policy, now_ms, batch_size * max_batches, dry_run=True
        )
        return PruneResult(len(ids), ids[:PRUNE_ID_LIMIT], dry_run=True, batches=0)
    count, batches = 0, 0
    shown: list[str] = []
    while batches < max_batches:
        gone = await store.prune_terminal_runs(policy, now_ms, batch_size)
        batches += 1
        count += len(gone)
        shown.extend(gone[: max(PRUNE_ID_LIMIT - len(shown), 0)])
        if len(gone) < batch_size:
            break
    return PruneResult(count, shown, dry_run=False, batches=batches)
