"""durably's testing kit: a whole engine for one test, with a clock the test controls;
recorded histories and their replay; step bodies that fail on purpose; assertions over runs.

`WorkflowEnvironment` builds an engine, a client and a store (in memory, a temporary SQLite
file or a URL), skips time whenever every run waits only for it, and can crash the engine's
store and restart over the same data. The pytest plugin (`durably.testing.pytest_plugin`,
registered by installing durably) gives tests the `durably_env` fixture.

`load_history(path_or_dict)` reads a history written by `client.export_history(run_id)` or
`durably runs export`; `Replayer(workflows=[...]).replay(history)` replays it against the
code deployed now without executing a step, raising `durably.NonDeterminismError` when the
code no longer follows it; `replay_histories(folder, workflows=[...])` replays every history
file of a folder. `fail_once(value)` / `fail_times(n, value)` are step bodies that raise,
then return `value`; `assert_steps_ran`, `assert_step_attempts`, `assert_output` and
`assert_run_status` check what a run did.
"""

from durably.testing.assertions import (
    assert_output,
    assert_run_status,
    assert_step_attempts,
    assert_steps_ran,
    recorded_steps,
)
from durably.testing.clock import TestClock
from durably.testing.crash import StoreCrashed
from durably.testing.environment import WorkflowEnvironment
from durably.testing.faults import fail_once, fail_times
from durably.testing.history import HistoryFormatError, RunHistory, load_history
from durably.testing.replayer import Replayer, ReplayResult, history_files, replay_histories

# The conformance suites are `durably.testing.conformance` (it needs pytest).

__all__ = [
    "HistoryFormatError",
    "ReplayResult",
    "Replayer",
    "RunHistory",
    "StoreCrashed",
    "TestClock",
    "WorkflowEnvironment",
    "assert_output",
    "assert_run_status",
    "assert_step_attempts",
    "assert_steps_ran",
    "fail_once",
    "fail_times",
    "history_files",
    "load_history",
    "recorded_steps",
    "replay_histories",
]
