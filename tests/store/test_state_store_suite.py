"""The state-store suite (`durably.testing.conformance.StateStoreSuite`) on every first-party
store: memory, SQLite and PostgreSQL.

The cases themselves live in the package, so a third-party store runs exactly these
(tests/third_party shows one). Here the suite also bounds the round trips of a call, which
the first-party stores count (`statement_count`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from durably import StateStore
from durably.testing.conformance import StateStoreSuite, StoreClock
from tests.store.conftest import FIRST_PARTY, open_first_party
from tests.store.support import ConformantStore


class TestStateStore(StateStoreSuite):
    @pytest.fixture(params=FIRST_PARTY)
    async def store(
        self, request: pytest.FixtureRequest, tmp_path: Path, store_clock: StoreClock
    ) -> AsyncIterator[Any]:
        async with open_first_party(request.param, tmp_path, store_clock) as opened:
            yield opened

    def round_trips(self, store: StateStore) -> int | None:
        return cast(ConformantStore, store).statement_count
