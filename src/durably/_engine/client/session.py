"""How a `Client` reaches its runs: its control plane, its waits, opening and closing.

Two kinds, behind one small protocol (`ClientSession`):

- `StoreSession`: a standalone client's. It opens its own store (the schema, the store's wake
  bus) on first use, announces what it did on that bus, wakes its waits on `settled`
  messages, and closes the store if it opened it.
- `HostedSession`: a client over a control plane something else runs (an `Engine`'s worker,
  a gateway inside one): opening it opens the host, its waits are the host's, and closing it
  closes nothing (the host closes with itself).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from durably._engine.client.handle import RunWatchers
from durably._engine.control.plane import ControlPlane
from durably._engine.control.signals import SignalBufferPolicy

if TYPE_CHECKING:
    from durably._store.protocol import StateStore, WakeBus

__all__ = ["ClientSession", "HostedSession", "StoreSession"]


class ClientSession(Protocol):
    """What a client works through."""

    @property
    def plane(self) -> ControlPlane:
        """The store, clock, buffer policy and wake announcements of the client's writes."""
        ...

    @property
    def watchers(self) -> RunWatchers:
        """The `wait_for_run` calls of the client, and their wake-ups."""
        ...

    async def open(self) -> None:
        """Make the store usable (idempotent); every call that touches it opens first."""
        ...

    async def close(self) -> None:
        """Release what opening took."""
        ...

    def poll_interval(self, run_id: str) -> float:
        """How often a wait on this run re-reads it without a wake, in seconds."""
        ...


class StoreSession:
    """A standalone client's session on its own store (module docstring)."""

    def __init__(
        self,
        store: StateStore,
        *,
        owns_store: bool,
        namespace: str | None,
        clock: Callable[[], int],
        policy: SignalBufferPolicy,
    ):
        self._store = store
        self._owns_store = owns_store
        self._bus: WakeBus | None = None
        self._opened = False
        self._open_lock: asyncio.Lock | None = None
        # wait_for_run calls of this client, woken by `settled` messages on the wake bus
        self._watchers = RunWatchers()
        self._plane = ControlPlane(
            store, clock=clock, signal_buffer=policy, announce=self._announce, namespace=namespace
        )

    @property
    def plane(self) -> ControlPlane:
        return self._plane

    @property
    def watchers(self) -> RunWatchers:
        return self._watchers

    async def open(self) -> None:
        if self._opened:
            return
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._opened:
                return
            await self._store.ensure_schema()
            bus = self._store.wake_bus()  # None: the store has no cross-process channel
            if bus is not None:
                await bus.start(self._on_wake)
                self._bus = bus
            self._opened = True

    async def close(self) -> None:
        bus, self._bus = self._bus, None
        if bus is not None:
            await bus.close()
        self._opened = False
        if self._owns_store:
            await self._store.close()

    def poll_interval(self, run_id: str) -> float:
        # A `settled` message on the wake bus re-reads at once; polling is the fallback
        # (and the only way on a store without a bus).
        return 1.0 if self._bus is not None else 0.25

    async def _announce(self, kind: str, run_id: str) -> None:
        """Tell the workers (and other clients); best effort — they poll as well."""
        if self._bus is not None:
            try:
                await self._bus.publish(kind, run_id)
            except Exception:
                pass  # a lost wake costs latency only: every worker polls the store

    def _on_wake(self, kind: str, run_id: str) -> None:
        if kind == "settled":
            self._watchers.wake(run_id)


class HostedSession:
    """A client's session over a host's control plane (module docstring): `opener` opens
    the host, `watchers` and `poll` are the host's waits (woken by its events and wake bus)."""

    __slots__ = ("_opener", "_plane", "_poll", "_watchers")

    def __init__(
        self,
        plane: ControlPlane,
        *,
        opener: Callable[[], Awaitable[None]],
        watchers: RunWatchers,
        poll: Callable[[str], float],
    ):
        self._plane = plane
        self._opener = opener
        self._watchers = watchers
        self._poll = poll

    @property
    def plane(self) -> ControlPlane:
        return self._plane

    @property
    def watchers(self) -> RunWatchers:
        return self._watchers

    async def open(self) -> None:
        await self._opener()

    async def close(self) -> None:
        """Nothing: the host closes what it opened, with itself."""

    def poll_interval(self, run_id: str) -> float:
        return self._poll(run_id)
