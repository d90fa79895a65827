"""The roles of the store the read side uses (`durably._store.protocol`), by what it reads.

- `RunListStore`: the run list and its chips (lists, counts, facets, lease owners) and what
  each listed run waits on (its signal waiters; its pending remote steps and the workers'
  heartbeat rows, for a step no worker consumes).
- `RunDetailStore`: one run's detail and its fans' pages: the run row, its checkpoints and
  their aggregates.
"""

from __future__ import annotations

from typing import Protocol

from durably._store.protocol import (
    CheckpointStore,
    FleetStore,
    ReadStore,
    RunStore,
    SignalStore,
)

__all__ = ["RunDetailStore", "RunListStore"]


class RunListStore(ReadStore, SignalStore, CheckpointStore, FleetStore, Protocol):
    """The run list and what its runs wait on."""


class RunDetailStore(RunStore, CheckpointStore, ReadStore, Protocol):
    """One run's detail and its fans' members."""
