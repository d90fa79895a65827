"""Engines, fixtures and wait helpers shared by the runtime suites (tests/run, tests/control,
tests/client, tests/defs, tests/triggers, tests/worker, tests/remote, tests/store, tests/flow).

tests/conftest.py loads this module as a pytest plugin, so `engine_factory` and `uid` are
fixtures of every folder (a folder's own `uid` takes precedence); a test module imports the
rest (`EngineFactory`, `FAST_TUNING`, `wait_until`, ...) from here by name.

A test that takes `engine_factory` is parametrized over {store: memory, sqlite} × {mode: hot,
replay}. `hot` is the default resident execution (a waiting body stays alive in memory and is
never replayed); `replay` is the `always_replay=True` test mode (the run is evicted after every
live step and the next turn replays the body from its checkpoints). Every test must give the
same results in all four combinations.

PostgreSQL opt-in: a test module that sets `ENGINE_STORES = "postgres"` gets `engine_factory`
parametrized over {postgres} × {hot, replay} INSTEAD (ids `postgres-hot`, `postgres-replay`),
each test on a fresh schema of the local server (tests/pg_support.py: skipped when it is
unreachable, a failure under `DURABLY_REQUIRE_SERVICES=1`), dropped afterwards.
tests/run/test_pg_fans.py re-exports the fan / saga / onError / children suites this way,
so only they pay for PostgreSQL; every other module keeps the four default combinations.
Such a module may also set `PG_XFAIL = {"test_name": "reason"}`: those tests are marked
`xfail(strict=True)` on PostgreSQL (a known engine bug, named in the reason), and
`PG_FLAKY = {"test_name": "reason"}` for a bug that only SOMETIMES fails a test there (a race):
`xfail(strict=False)`, so neither outcome fails the run; pin such a bug with a deterministic
strict-xfail test elsewhere.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Engine, EngineEvent, InMemoryStateStore, StepCheckpoint, WorkflowRun
from tests.pg_support import fresh_schema, schema_url

_COMBINATIONS = [
    ("memory", "hot"),
    ("memory", "replay"),
    ("sqlite", "hot"),
    ("sqlite", "replay"),
]
PG_COMBINATIONS = [
    ("postgres", "hot"),
    ("postgres", "replay"),
]

# Small tuning so timers, recovery and leases react within tens of milliseconds.
# `reconcile_ms` (the safety-net wake of event-waiting suspends) is 3 s
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

    def __init__(self, store_kind: str, mode: str, tmp_path: Path, pg_schema: str | None = None):
        self.store_kind = store_kind
        self.mode = mode
        self._tmp_path = tmp_path
        self._pg_schema = pg_schema
        self._memory: InMemoryStateStore | None = None

    @property
    def replay(self) -> bool:
        return self.mode == "replay"

    @property
    def id(self) -> str:
        return f"{self.store_kind}-{self.mode}"

    def store(self) -> Any:
        """What to pass as `Engine(store=...)`: the shared memory store, the SQLite URL, or
        the PostgreSQL URL naming this test's schema."""
        if self.store_kind == "memory":
            if self._memory is None:
                self._memory = InMemoryStateStore()
            return self._memory
        if self.store_kind == "postgres":
            assert self._pg_schema is not None
            return schema_url(self._pg_schema)
        return f"sqlite:///{self._tmp_path / 'durably.db'}"

    def __call__(self, **options: Any) -> Engine:
        kwargs: dict[str, Any] = {**FAST_TUNING, "always_replay": self.replay, **options}
        return durably.Engine(store=self.store(), **kwargs)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `engine_factory`: the four default combinations, or only the PostgreSQL
    ones in a module that opts in with `ENGINE_STORES = "postgres"` (see the docstring)."""
    if "engine_factory" not in metafunc.fixturenames:
        return
    if getattr(metafunc.module, "ENGINE_STORES", None) == "postgres":
        name = metafunc.definition.name
        marks = [
            pytest.mark.xfail(strict=strict, reason=reasons[name])
            for attr, strict in (("PG_XFAIL", True), ("PG_FLAKY", False))
            if name in (reasons := getattr(metafunc.module, attr, {}))
        ]
        params = [pytest.param((s, m), id=f"{s}-{m}", marks=marks) for s, m in PG_COMBINATIONS]
    else:
        params = [pytest.param((s, m), id=f"{s}-{m}") for s, m in _COMBINATIONS]
    metafunc.parametrize("engine_factory", params, indirect=True)


@pytest.fixture
async def engine_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[EngineFactory]:
    store_kind, mode = request.param
    if store_kind != "postgres":
        yield EngineFactory(store_kind, mode, tmp_path)
        return
    # the store's ensure_schema() creates the schema; it is dropped (CASCADE) afterwards
    async with fresh_schema(create=False) as schema:
        yield EngineFactory(store_kind, mode, tmp_path, pg_schema=schema)


@pytest.fixture
def uid() -> str:
    """A prefix unique to this test invocation, for workflow/step/token names (the
    decorators register into a process-global registry)."""
    return f"t{next(_ids)}-{uuid.uuid4().hex[:6]}"


# ------------------------------------------------------------------ waits and records


RESULT_TIMEOUT = 10.0


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], *, timeout: float = RESULT_TIMEOUT
) -> None:
    """Poll an async predicate until it holds (fails the test on timeout)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.01)


async def wait_status(
    engine: Engine, run_id: str, *statuses: str, timeout: float = RESULT_TIMEOUT
) -> WorkflowRun:
    """Wait until the run exists and has one of `statuses`; returns the row."""
    found: list[WorkflowRun] = []

    async def check() -> bool:
        run = await engine.get_run(run_id)
        if run is not None and run.status in statuses:
            found.append(run)
            return True
        return False

    await wait_until(check, timeout=timeout)
    return found[-1]


async def wait_suspended(engine: Engine, run_id: str) -> WorkflowRun:
    """Wait until the run is settled `suspended` (via the handle, then a store read)."""
    run = await engine.get_handle(run_id).wait(timeout=RESULT_TIMEOUT)
    assert run.status == "suspended", run
    fresh = await engine.get_run(run_id)
    assert fresh is not None
    return fresh


def turn_ended(engine: Engine, run_id: str) -> bool:
    """No turn of the run is executing on this engine: either it is not driven here (a
    classic turn ended) or its resident body is parked."""
    return not engine._worker.turn_running(run_id)


async def wait_waiting_on(engine: Engine, run_id: str, token: str) -> None:
    """Wait until the run has registered a signal waiter on `token`, is suspended and its
    turn has ended (so a delivery does not race the end of the turn)."""

    async def check() -> bool:
        waiters = await engine.store.list_signal_waiters(token)
        run = await engine.get_run(run_id)
        return (
            any(w.run_id == run_id for w in waiters)
            and run is not None
            and run.status == "suspended"
            and turn_ended(engine, run_id)
        )

    await wait_until(check)


def shape(checkpoints: list[StepCheckpoint]) -> list[tuple[int, str, str, str]]:
    """(seq, name, kind, status) of every checkpoint: the mode-independent history shape."""
    return [(cp.seq, cp.name, cp.kind, cp.status) for cp in checkpoints]


class EventLog:
    """Collects EngineEvents of one engine (`engine.subscribe`)."""

    def __init__(self, engine: Engine):
        self.events: list[EngineEvent] = []
        self.unsubscribe = engine.subscribe(self.events.append)

    def of(self, run_id: str, *types: str) -> list[EngineEvent]:
        return [e for e in self.events if e.run_id == run_id and (not types or e.type in types)]

    def types(self, run_id: str) -> list[str]:
        return [e.type for e in self.of(run_id)]


def bump(counts: dict[str, int], key: str) -> int:
    counts[key] = counts.get(key, 0) + 1
    return counts[key]
