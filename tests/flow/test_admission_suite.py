"""The admission-backend suite (`durably.testing.conformance.AdmissionBackendSuite`) on
every backend durably has: in-process, PostgreSQL and Redis (the conftest's `open_world`).

The cases themselves live in the package, so a third-party backend runs exactly these.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from durably.testing.conformance import AdmissionBackendSuite
from tests.flow.conftest import BACKENDS, AdmissionWorld, open_world


class TestAdmission(AdmissionBackendSuite):
    @pytest.fixture(params=BACKENDS)
    async def world(self, request: pytest.FixtureRequest) -> AsyncIterator[AdmissionWorld]:
        async with open_world(request.param) as opened:
            yield opened
