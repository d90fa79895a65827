"""Fixtures of the engine ctx/behaviour suite.

Every test takes `engine_factory`, parametrized over {store: memory, sqlite} × {mode: hot,
replay}. `hot` is the default resident execution (a waiting body stays alive in memory and is
never replayed); `replay` is the `always_replay=True` test mode (the run is evicted after every
live step and the next turn replays the body from its checkpoints). Every test must give the
same results in all four combinations.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Engine, InMemoryStateStore

_COMBINATIONS = [
    ("memory", "hot"),
    ("memory", "replay"),
    ("sqlite", "hot"),
    ("sqlite", "replay"),
]

# Small tuning so timers, recovery and leases react within tens of milliseconds.
# `reconcile_ms` (the safety-net wake of event-waiting suspends, engine.md §9.4) is 3 s
# instead of 300 s so a rare lost wake (see test_delivery_racing_the_end_of_a_classic_turn)
# costs a test seconds instead of a timeout; that test pins the race with the default.
FAST_TUNING: dict[str, Any] = {
    "timer_poll_ms": 20,
    "lease_ms": 2000,
    "drain_timeout_ms": 2000,
    "reconcile_ms": 3000,
}

_ids = itertools.count()


class EngineFactory:
    """Builds engines on ONE store per test (so a second engine sees the first one's runs)."""

    def __init__(self, store_kind: str, mode: str, tmp_path: Path):
        self.store_kind = store_kind
        self.mode = mode
        self._tmp_path = tmp_path
        self._memory: InMemoryStateStore | None = None

    @property
    def replay(self) -> bool:
        return self.mode == "replay"

    @property
    def id(self) -> str:
        return f"{self.store_kind}-{self.mode}"

    def store(self) -> Any:
        """What to pass as `Engine(store=...)`: the shared memory store, or the SQLite URL."""
        if self.store_kind == "memory":
            if self._memory is None:
                self._memory = InMemoryStateStore()
            return self._memory
        return f"sqlite:///{self._tmp_path / 'durably.db'}"

    def __call__(self, **options: Any) -> Engine:
        kwargs: dict[str, Any] = {**FAST_TUNING, "always_replay": self.replay, **options}
        return durably.Engine(store=self.store(), **kwargs)


@pytest.fixture(params=_COMBINATIONS, ids=[f"{s}-{m}" for s, m in _COMBINATIONS])
def engine_factory(request: pytest.FixtureRequest, tmp_path: Path) -> EngineFactory:
    store_kind, mode = request.param
    return EngineFactory(store_kind, mode, tmp_path)


@pytest.fixture
def uid() -> str:
    """A prefix unique to this test invocation, for workflow/step/token names (the
    decorators register into a process-global registry)."""
    return f"t{next(_ids)}-{uuid.uuid4().hex[:6]}"
