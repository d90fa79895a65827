"""The event-trigger suite (test_triggers.py) again, on the real PostgreSQL store.

Every `engine_factory` test of test_triggers.py is re-exported here under its own name;
`ENGINE_STORES = "postgres"` makes tests/engine_support.py parametrize them over {postgres} ×
{hot, replay} only (a fresh schema per test, dropped afterwards; skipped when PostgreSQL is
unreachable, a failure under `DURABLY_REQUIRE_SERVICES=1`).
"""

from __future__ import annotations

import inspect

from tests.triggers import test_triggers

ENGINE_STORES = "postgres"

globals().update(
    {
        name: fn
        for name, fn in vars(test_triggers).items()
        if name.startswith("test_")
        and inspect.isfunction(fn)
        and "engine_factory" in inspect.signature(fn).parameters
    }
)
