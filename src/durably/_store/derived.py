"""Contract methods written once, over other contract methods: `DerivedStoreMethods`.

A method belongs here only when deriving it costs every store nothing: the same number of
round trips and the same answer as a store's own implementation would have. Then one
implementation replaces one per store, and a store cannot get it subtly wrong. Each method
says what it is derived from and why that is free. The class knows nothing of its host but
the contract methods it calls (small protocols below), so it works over any store.

Everything else in the contract stays per store on purpose: a derivation would add a round
trip on a hot path (`list_checkpoints` as an unfiltered `query_checkpoints` loses the
prebuilt point read replay uses; `create_run` as `create_runs([run])` adds the lookup of
existing ids), read more rows (a count as a list), or lose atomicity (a take as a read and a
delete).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from durably._core.aggregates import CheckpointQuery
from durably._core.models import StepCheckpoint

__all__ = ["DerivedStoreMethods"]


class _SavesCheckpointsIfPending(Protocol):
    async def save_checkpoints_if_pending(self, cps: Sequence[StepCheckpoint]) -> list[bool]: ...


class _QueriesCheckpoints(Protocol):
    async def query_checkpoints(
        self, run_id: str, query: CheckpointQuery
    ) -> list[StepCheckpoint]: ...


class DerivedStoreMethods:
    """The derived part of the contract, inherited by the first-party stores."""

    async def save_checkpoint_if_pending(
        self: _SavesCheckpointsIfPending, cp: StepCheckpoint
    ) -> bool:
        """The batch compare-and-set of one row. Free: a batch of one is one conditional
        UPDATE on every store (the SQL store sends a single row as exactly that statement,
        without the batch's SELECT), the same statement a single-row method would send."""
        return (await self.save_checkpoints_if_pending([cp]))[0]

    async def list_checkpoints_by_name_prefix(
        self: _QueriesCheckpoints, run_id: str, prefixes: Sequence[str]
    ) -> list[StepCheckpoint]:
        """`query_checkpoints` filtered by name prefixes only (exact, case-sensitive; seq
        order; no prefix matches nothing). Free: both are one filtered SELECT ordered by seq
        on the SQL stores (neither is prebuilt), and no statement at all for no prefix."""
        return await self.query_checkpoints(run_id, CheckpointQuery(name_prefixes=prefixes))
