"""In-process checks of the CLI's rendering helpers and the live progress line."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest

from durably import EngineEvent, StepError
from durably._cli import progress as progress_module
from durably._cli.common import CliError, parse_json_arg
from durably._cli.progress import Progress
from durably._cli.render import format_duration, relative_time, table
from durably._cli.runstate import FanState
from durably._core.models import now_utc


def test_format_duration() -> None:
    assert format_duration(0) == "0ms"
    assert format_duration(999) == "999ms"
    assert format_duration(1500) == "1.5s"
    assert format_duration(90_000) == "1.5m"
    assert format_duration(None) == ""


def test_relative_time() -> None:
    now = now_utc()
    assert relative_time(now - timedelta(seconds=5), now) == "5s ago"
    assert relative_time(now - timedelta(minutes=3), now) == "3m ago"
    assert relative_time(now - timedelta(hours=2), now) == "2h ago"
    assert relative_time(now - timedelta(days=4), now) == "4d ago"


def test_table_pads_columns_with_two_space_gaps() -> None:
    lines = table(["RUN", "STATUS"], [["a", "completed"], ["long-id", "x"]])
    assert lines == ["RUN      STATUS", "a        completed", "long-id  x"]


def test_parse_json_arg_names_the_problem() -> None:
    assert parse_json_arg('{"a": [1, 2]}', "--input") == {"a": [1, 2]}
    assert parse_json_arg(None, "--input") is None
    with pytest.raises(CliError) as caught:
        parse_json_arg("{oops", "--payload")
    assert caught.value.exit_code == 2
    assert caught.value.message.startswith("--payload is not valid JSON")


def _events() -> list[EngineEvent]:
    return [
        EngineEvent(type="run.started", run_id="r", workflow="wf"),
        EngineEvent(type="step.started", run_id="r", name="a", seq=0, attempt=1),
        EngineEvent(
            type="step.failed",
            run_id="r",
            name="a",
            seq=0,
            attempt=1,
            error=StepError(message="boom"),
        ),
        EngineEvent(type="step.started", run_id="r", name="a", seq=0, attempt=2),
        EngineEvent(type="step.completed", run_id="r", name="a", seq=0, duration_ms=12.0),
        EngineEvent(type="run.completed", run_id="r", workflow="wf"),
    ]


def test_progress_is_a_live_display_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "REDRAW_S", 0.0)  # draw every event, not every 80ms
    out = io.StringIO()
    progress = Progress(out, tty=True)
    for event in _events():
        progress(event)
    progress.finish()
    text = out.getvalue()
    assert "\x1b[" in text  # drawn with control codes, redrawn in place
    assert "attempt 1 failed: boom" in text
    assert "(attempt 2)" in text
    assert progress.steps_done == 1 and progress.retries == 1
    # Only notable moments stay: the failed attempt and the end of the run.
    permanent = [line for line in text.split("\n") if "boom" in line or "■" in line]
    assert len(permanent) == 2


def test_progress_prints_plain_lines_otherwise() -> None:
    out = io.StringIO()
    progress = Progress(out, tty=False)
    for event in _events():
        progress(event)
    progress.finish()
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.strip().splitlines()
    assert len(lines) == len(_events())
    assert any("✓ a" in line for line in lines)


def test_plain_progress_counts_a_fan_in_milestones() -> None:
    out = io.StringIO()
    progress = Progress(out, tty=False)
    progress(EngineEvent(type="run.started", run_id="r", workflow="wf"))
    for i in range(300):
        progress(EngineEvent(type="step.started", run_id="r", name="leaf", seq=i, attempt=1))
    for i in range(300):
        progress(EngineEvent(type="step.completed", run_id="r", name="leaf", seq=i, duration_ms=1))
    lines = out.getvalue().splitlines()
    assert len(lines) < 40  # not a line per member
    counts = [int(line.split("… ")[1].split()[0]) for line in lines if "… " in line]
    assert counts == [4, 5, 6, 7, 8, 9, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300]
    assert lines[-1].endswith("leaf 300/300")


def test_a_terminal_draws_each_fan_with_its_total(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "REDRAW_S", 0.0)
    out = io.StringIO()
    progress = Progress(out, tty=True)
    progress(EngineEvent(type="run.started", run_id="r", workflow="wf"))
    progress.set_fans([FanState("all:0:10", "leaf", 10, {"completed": 4, "failed": 1})])
    progress.tick()
    progress.finish()
    text = out.getvalue()
    assert "fan all:0:10 leaf" in text and "5/10 done, 1 failed" in text
