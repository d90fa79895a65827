"""A third party proves its admission backend with durably's admission-backend suite.

`DelegatingAdmission` is written the way another project would write a backend of its own:
a class of its own implementing the `AdmissionBackend` contract explicitly — here each call
goes to one `LocalAdmission` that every owner of the test shares (as the processes of a
fleet share a server), so the suite must pass. `open_world` hands the suite a
`BackendWorld`: one backend per owner, made by the factory, closed after the case.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager

from durably import Queue
from durably._core.admission import FreedListener, LocalAdmission
from durably.testing.conformance import (
    Admission,
    AdmissionBackend,
    AdmissionBackendSuite,
    AdmissionWorld,
    BackendWorld,
    ManualClock,
    QueueStats,
)


class DelegatingAdmission:
    """A backend of its own, acting for `owner` on a shared `LocalAdmission`."""

    def __init__(self, shared: LocalAdmission, owner: str) -> None:
        self._shared = shared
        self.owner = owner
        self.closed = False

    async def acquire(self, queue: Queue, holder: str, *, key: str, priority: int = 0) -> Admission:
        return await self._shared.acquire(queue, holder, key=key, priority=priority)

    async def release(self, *holders: str) -> int:
        return await self._shared.release(*holders)

    async def renew(self, holders: Collection[str]) -> set[str]:
        return await self._shared.renew(holders)

    def on_freed(self, listener: FreedListener) -> None:
        self._shared.on_freed(listener)

    async def stats(self, queues: Sequence[Queue]) -> list[QueueStats]:
        return await self._shared.stats(queues)

    async def close(self) -> None:
        self.closed = True


class TestDelegatingAdmission(AdmissionBackendSuite):
    @asynccontextmanager
    async def open_world(self) -> AsyncIterator[AdmissionWorld]:
        shared: list[LocalAdmission] = []  # the one admission state of this case
        made: list[DelegatingAdmission] = []

        async def backend(clock: ManualClock, owner: str) -> AdmissionBackend:
            if not shared:
                shared.append(LocalAdmission(clock=clock))
            made.append(DelegatingAdmission(shared[0], owner))
            return made[-1]

        async with BackendWorld(backend) as world:
            yield world
        # The world closed every backend it made.
        assert made and all(b.closed for b in made)
