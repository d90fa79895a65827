"""`StateStoreSuite`: every case of the state-store contract, for any store.

Subclass it in a test module (the class name starts with `Test`) and say how to open a fresh,
empty store: either define `open_store(clock)` (an async context manager yielding the store,
reading the time from `clock`, and closing it afterwards) or override the `store` fixture
itself, e.g. to parametrize it over several stores (it takes the `store_clock` fixture). A
store whose backing service is down raises `StateStoreUnavailable` from `open_store`, and the
cases are skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import ClassVar

import pytest
import pytest_asyncio

from durably import StateStore
from durably._store.protocol import StateStoreUnavailable

from .activity import ActivityCases
from .aggregates import AggregateCases
from .bulk import BulkCases
from .checkpoints import CheckpointCases
from .claims import ClaimCases
from .facets import FacetCases
from .fleet import FleetCases
from .leases import LeaseCases
from .listing import ListingCases
from .retention import RetentionCases
from .runs import RunCases
from .schedules import ScheduleCases
from .signal_buffer import SignalBufferCases
from .support import StoreClock
from .waiters import WaiterCases


class StateStoreSuite(
    RunCases,
    CheckpointCases,
    ClaimCases,
    LeaseCases,
    ListingCases,
    WaiterCases,
    SignalBufferCases,
    BulkCases,
    RetentionCases,
    FacetCases,
    ActivityCases,
    FleetCases,
    AggregateCases,
    ScheduleCases,
):
    """The state-store contract as pytest cases; each takes the `store` fixture.

    Subclass it (the class name starts with `Test`) and define `open_store(clock)`, or
    override the `store` fixture. Answer `round_trips` if the store counts its round trips.
    """

    # Every case is a coroutine: marked, so the suite runs under pytest-asyncio's strict
    # mode as well as its auto mode.
    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.asyncio]

    def open_store(self, clock: StoreClock) -> AbstractAsyncContextManager[StateStore]:
        """A fresh, empty store reading the time from `clock` (expiry is judged by the
        store's clock, which some cases move), closed when the context exits. Override it
        (or the `store` fixture); raise `StateStoreUnavailable` to skip the cases."""
        raise NotImplementedError(
            f"{type(self).__name__} must define open_store() or override the store fixture"
        )

    @pytest.fixture
    def store_clock(self) -> StoreClock:
        """The clock of one case's store: the wall clock until a case moves it."""
        return StoreClock()

    @pytest_asyncio.fixture
    async def store(self, store_clock: StoreClock) -> AsyncIterator[StateStore]:
        """The store of one case, from `open_store` (skipped when it is unavailable)."""
        async with AsyncExitStack() as stack:
            try:
                store = await stack.enter_async_context(self.open_store(store_clock))
            except StateStoreUnavailable as exc:
                pytest.skip(f"the store is unavailable: {exc}")
            yield store
