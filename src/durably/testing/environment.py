"""`WorkflowEnvironment`: an engine, a client, a store and a clock for one test.

    async with WorkflowEnvironment(workflows=[checkout], store="memory") as env:
        assert await env.run(checkout, order) == {...}

The environment owns everything it builds and closes it at exit: the store (`"memory"`,
`"sqlite"` — a temporary file, removed at exit — or a store URL, so one test can run on
PostgreSQL), the engine over it, a `durably.Client` over the same store, the `TestClock`
both read and, with `time_skipping=True` (the default), the `TimeSkipper` that moves that
clock to the next deadline whenever nothing but time is left to wait for
(`durably.testing.skipping` has the rule). `crash_after` makes the engine's store die like
a killed process (`durably.testing.crash`) and `restart` builds a new engine over the same
data, as a restarted worker would.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, TypeVar, overload

from durably._core.log_context import durably_logger
from durably._engine.client.client import Client
from durably._engine.client.handle import RunHandle
from durably._engine.defs.registry import Step, Workflow
from durably._engine.defs.stores import open_store
from durably._engine.engine import Engine
from durably._store.memory import InMemoryStateStore
from durably._store.protocol import StateStore
from durably.testing.clock import Instant, TestClock
from durably.testing.crash import CrashableStore, CrashKind, StoreCrashed, WriteLog
from durably.testing.skipping import TimeSkipper

__all__ = ["STORE_KINDS", "WorkflowEnvironment"]

log = durably_logger("durably.testing")

O = TypeVar("O")

#: The store names `WorkflowEnvironment(store=...)` takes besides a URL or a store object.
STORE_KINDS = ("memory", "sqlite")

# Options the environment sets itself: a keyword for them would be ignored or contradict it.
_OWN_OPTIONS = ("store", "clock", "workflows", "steps", "instance_id", "transport")

# A drain that waits for turns the crashed store ended would otherwise last the engine's
# default drain timeout at every restart.
_DEFAULT_DRAIN_MS = 2_000


class WorkflowEnvironment:
    """An engine, its store, a client and a controllable clock for a test.

    `workflows` and `steps` are what the engine serves (as `Engine(workflows=, steps=)`);
    `store` is `"memory"` (the default), `"sqlite"` (a temporary file), a store URL
    (`"postgresql://…"`, `"sqlite:///path.db"`) or a store object the test keeps; `start`
    is where the clock begins (an aware datetime or epoch ms; default: now). Every other
    keyword is an `Engine` option (`lease_ms=`, `schedules=`, `max_concurrent_runs=`, …).

    With `time_skipping=True` the clock jumps to the next deadline as soon as every run waits
    only for time: a 30-day sleep completes at once. The timeout of a wait for a signal, an
    event or an update expires only while the test awaits an outcome (`run`, `result`), since
    until then the test may still send it. With `time_skipping=False` the clock moves only by
    `env.clock.advance(...)` / `env.clock.set(...)`; after every move the engine polls at once.
    """

    def __init__(
        self,
        *,
        workflows: list[Workflow[Any, Any]] | None = None,
        steps: list[Step[Any, Any]] | None = None,
        store: str | StateStore = "memory",
        time_skipping: bool = True,
        start: Instant | None = None,
        **engine_options: Any,
    ):
        given = sorted(set(_OWN_OPTIONS) & set(engine_options))
        if given:
            raise TypeError(
                f"WorkflowEnvironment sets {', '.join(given)} itself: "
                "pass the store as store=, and read the clock from env.clock"
            )
        if isinstance(store, str) and not store.strip():
            raise ValueError("WorkflowEnvironment(store=''): 'memory', 'sqlite' or a store URL")
        self._workflows = list(workflows) if workflows is not None else None
        self._steps = list(steps) if steps is not None else None
        self._store_spec = store
        self._options: dict[str, Any] = {"drain_timeout_ms": _DEFAULT_DRAIN_MS, **engine_options}
        if "schedules" in engine_options:  # read by each engine and by the skipper
            self._options["schedules"] = list(engine_options["schedules"])
        self.clock = TestClock(start)
        self._time_skipping = time_skipping
        self._instance_id = f"durably-test-{uuid.uuid4().hex[:8]}"
        self._writes = WriteLog()
        self._tmp: Path | None = None
        self._inner: StateStore | None = None
        self._owns_inner = False
        self._view: CrashableStore | None = None
        self._engine: Engine | None = None
        self._client: Client | None = None
        self._skipper: TimeSkipper | None = None

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> WorkflowEnvironment:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Build and open the store, the engine, the client and the skipper."""
        if self._engine is not None:
            return
        try:
            inner = self._inner = self._open_store()
            await inner.ensure_schema()
            self._engine = self._new_engine()
            await self._engine.open()
            # The client stands for another process (a web tier): its wrapper never dies.
            self._client = Client(
                CrashableStore(inner, self._writes),
                namespace=self.namespace,
                codec=self._options.get("codec"),  # the engine's payload codec, if any
            )
            self._skipper = TimeSkipper(
                inner,
                self.clock,
                self._writes,
                lambda: self._engine,
                namespace=self.namespace,
                skipping=self._time_skipping,
                schedules=self._options.get("schedules", ()),
            )
            self._skipper.start()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop the skipper, close the engine, the client and the store; remove a temporary
        SQLite file."""
        skipper, self._skipper = self._skipper, None
        if skipper is not None:
            await skipper.stop()
        await self._close_engine()
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        inner, self._inner = self._inner, None
        if inner is not None and self._owns_inner:
            await inner.close()
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    def _open_store(self) -> StateStore:
        spec = self._store_spec
        if not isinstance(spec, str):
            self._owns_inner = False
            return spec
        if spec == "memory":
            # Buffered signals expire by the store's clock: the test's, here.
            self._owns_inner = True
            return InMemoryStateStore(clock=self.clock.now_utc)
        if spec == "sqlite":
            self._tmp = Path(tempfile.mkdtemp(prefix="durably-test-"))
            spec = f"sqlite:///{self._tmp / 'durably.db'}"
        store, self._owns_inner = open_store(spec)
        return store

    def _new_engine(self) -> Engine:
        assert self._inner is not None
        self._view = CrashableStore(self._inner, self._writes)
        return Engine(
            self._view,
            workflows=self._workflows,
            steps=self._steps,
            clock=self.clock.now,
            instance_id=self._instance_id,
            **self._options,
        )

    async def _close_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        try:
            await engine.close()
        except StoreCrashed as exc:  # a dead process's last writes fail: expected
            log.debug("closing the crashed engine: %s", exc)

    # ------------------------------------------------------------------ parts

    @property
    def engine(self) -> Engine:
        """The engine now serving the environment (a new one after `restart`)."""
        if self._engine is None:
            raise RuntimeError("the environment is not open: use `async with` first")
        return self._engine

    @property
    def client(self) -> Client:
        """A `durably.Client` over the same store, as another process would hold one."""
        if self._client is None:
            raise RuntimeError("the environment is not open: use `async with` first")
        return self._client

    @property
    def store(self) -> StateStore:
        """The real store (reads here see everything that landed, even after a crash)."""
        if self._inner is None:
            raise RuntimeError("the environment is not open: use `async with` first")
        return self._inner

    @property
    def namespace(self) -> str | None:
        namespace: str | None = self._options.get("namespace", "default")
        return namespace

    @property
    def time_skipping(self) -> bool:
        return self._time_skipping

    # ------------------------------------------------------------------ runs

    @overload
    async def start(
        self, workflow: Workflow[Any, O], input: Any = None, *, run_id: str | None = None
    ) -> RunHandle[O]: ...

    @overload
    async def start(
        self, workflow: str, input: Any = None, *, run_id: str | None = None
    ) -> RunHandle[Any]: ...

    async def start(
        self, workflow: Workflow[Any, Any] | str, input: Any = None, *, run_id: str | None = None
    ) -> RunHandle[Any]:
        """Start a run on the engine and return its handle at once (`Engine.start`). Await
        its outcome with `env.result(handle)`, so the timeouts of its waits for signals can
        be skipped too."""
        return await self.engine.start(workflow, input, run_id=run_id)

    @overload
    async def run(
        self, workflow: Workflow[Any, O], input: Any = None, *, run_id: str | None = None
    ) -> O: ...

    @overload
    async def run(self, workflow: str, input: Any = None, *, run_id: str | None = None) -> Any: ...

    async def run(
        self, workflow: Workflow[Any, Any] | str, input: Any = None, *, run_id: str | None = None
    ) -> Any:
        """Start a run and return its output; a run that failed raises its failure, as
        `RunHandle.result()` does."""
        handle = await self.start(workflow, input, run_id=run_id)
        return await self.result(handle)

    @overload
    async def result(self, handle: RunHandle[O], *, timeout: float | None = None) -> O: ...

    @overload
    async def result(self, handle: str, *, timeout: float | None = None) -> Any: ...

    async def result(self, handle: RunHandle[Any] | str, *, timeout: float | None = None) -> Any:
        """The output of a run (a handle or a run id), waiting for it with time skipping at
        full strength (the module doc): a run that failed raises its failure."""
        run_id = handle if isinstance(handle, str) else handle.run_id
        # Through the engine serving now: a handle from before a restart would read the store
        # through the dead engine.
        fresh = self.engine.get_handle(run_id)
        if self._skipper is None:
            return await fresh.result(timeout=timeout)
        async with self._skipper.awaiting():
            return await fresh.result(timeout=timeout)

    # ------------------------------------------------------------------ crashes

    def crash_after(self, n: int, kind: CrashKind = "checkpoint") -> None:
        """Make the engine's store die after the `n`-th write of `kind` from now on
        (`"checkpoint"`, `"run_update"` or `"write"`): that write lands, the call raises
        `StoreCrashed`, and so does every later call, as if the process had been killed right
        after the commit. `await env.restart()` brings up a new engine over the same data."""
        if self._view is None:
            raise RuntimeError("the environment is not open: use `async with` first")
        self._view.crash_after(n, kind)

    async def crash(self) -> None:
        """Make the engine's store die now (as `crash_after`, without waiting for a write)."""
        if self._view is None:
            raise RuntimeError("the environment is not open: use `async with` first")
        await self._view.crash()

    @property
    def crashed(self) -> bool:
        """The engine's store has died (`crash_after`, `crash`) and no restart followed."""
        return self._view is not None and self._view.crashed

    def writes(self, kind: CrashKind = "write") -> int:
        """How many writes of `kind` the engine serving now has made."""
        if self._view is None:
            raise RuntimeError("the environment is not open: use `async with` first")
        return self._view.writes(kind)

    async def restart(self) -> Engine:
        """Close the engine (a crashed one stops where its store died) and open a new one
        over the same store, under the same instance id: it voids the old leases and
        recovers the old engine's runs at once, as a restarted worker does. Returns it."""
        if self._inner is None:
            raise RuntimeError("the environment is not open: use `async with` first")
        await self._close_engine()
        self._engine = self._new_engine()
        await self._engine.open()
        return self._engine
