"""durably's testing kit: a whole engine for one test, with a clock the test controls.

`WorkflowEnvironment` builds an engine, a client and a store (in memory, a temporary SQLite
file or a URL), skips time whenever every run waits only for it, and can crash the engine's
store and restart over the same data. The pytest plugin (`durably.testing.pytest_plugin`,
registered by installing durably) gives tests the `durably_env` fixture.
"""

from durably.testing.clock import TestClock
from durably.testing.crash import StoreCrashed
from durably.testing.environment import WorkflowEnvironment

# The history, replay, fault and assertion helpers, and the conformance suites, are listed here too.

__all__ = ["StoreCrashed", "TestClock", "WorkflowEnvironment"]
