"""durably's testing kit: recorded histories and their replay, step bodies that fail on
purpose, and assertions over runs.

- `load_history(path_or_dict)` reads a history written by `client.export_history(run_id)`
  or `durably runs export`; `Replayer(workflows=[...]).replay(history)` replays it against
  the code deployed now without executing a step, raising `durably.NonDeterminismError`
  when the code no longer follows it; `replay_histories(folder, workflows=[...])` replays
  every history file of a folder.
- `fail_once(value)` / `fail_times(n, value)`: step bodies that raise, then return `value`.
- `assert_steps_ran`, `assert_step_attempts`, `assert_output`, `assert_run_status`.
"""

from durably.testing.assertions import (
    assert_output,
    assert_run_status,
    assert_step_attempts,
    assert_steps_ran,
    recorded_steps,
)
from durably.testing.faults import fail_once, fail_times
from durably.testing.history import HistoryFormatError, RunHistory, load_history
from durably.testing.replayer import Replayer, ReplayResult, history_files, replay_histories

__all__ = [
    "HistoryFormatError",
    "ReplayResult",
    "Replayer",
    "RunHistory",
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
