"""Conformance suites: the contracts of durably's state store, transport and admission
backend as pytest cases, for any implementation of them.

Each suite is a class to subclass in a test module (name the subclass `Test...`) with a
fixture saying how to open a fresh instance:

- `StateStoreSuite`: define `open_store(clock)` (an async context manager yielding a fresh,
  empty store that reads the time from the `StoreClock` it is given) or override the `store`
  fixture;
- `TransportSuite`: define `open_transport()` or override the `transport` fixture;
- `AdmissionBackendSuite`: define `open_world()` (usually a `BackendWorld` over a factory
  of backends) or override the `world` fixture: an `AdmissionWorld` hands out backends that
  share one admission state and one `ManualClock`.

The suites need pytest and pytest-asyncio; `import durably` never imports them.
"""

from __future__ import annotations

try:
    import pytest  # noqa: F401
    import pytest_asyncio  # noqa: F401
except ImportError as exc:  # pragma: no cover - only without the test tools
    raise ImportError(
        "durably.testing.conformance runs its suites under pytest: install pytest and "
        f"pytest-asyncio (pip install pytest pytest-asyncio); missing: {exc.name}"
    ) from exc

from durably._core.admission import Admission, AdmissionBackend, QueueStats
from durably._store.protocol import StateStoreUnavailable

from .admission import AdmissionBackendSuite, AdmissionWorld, BackendWorld, ManualClock
from .state_store import StateStoreSuite
from .state_store.support import StoreClock
from .transport import TransportSuite

__all__ = [
    "Admission",
    "AdmissionBackend",
    "AdmissionBackendSuite",
    "AdmissionWorld",
    "BackendWorld",
    "ManualClock",
    "QueueStats",
    "StateStoreSuite",
    "StateStoreUnavailable",
    "StoreClock",
    "TransportSuite",
]
