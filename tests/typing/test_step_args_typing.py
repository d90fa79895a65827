"""`ctx.step(step, *args, **kwargs)` under `mypy --strict`: calls matching the step's
parameters type-check (and return its output type), and a wrong argument type, a missing or
unknown argument, or an option keyword outside the single-input form is reported."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).with_name("step_args_sample.py")
MARK = "# mypy-error: "


@pytest.mark.timeout(300)
def test_mypy_accepts_matching_step_calls_and_reports_exactly_the_marked_ones() -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    expected = {n: line.split(MARK, 1)[1] for n, line in enumerate(lines, 1) if MARK in line}
    assert len(expected) >= 6  # the sample really holds mistakes to catch
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(SAMPLE)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    reported: dict[int, list[str]] = {}
    for line in result.stdout.splitlines():
        match = re.match(r".*step_args_sample\.py:(\d+): error: (.*)", line)
        if match is not None:
            reported.setdefault(int(match.group(1)), []).append(match.group(2))
    unexpected = {n: msgs for n, msgs in reported.items() if n not in expected}
    assert unexpected == {}, result.stdout + result.stderr
    missed = {
        n: text
        for n, text in expected.items()
        if not any(text in msg for msg in reported.get(n, []))
    }
    assert missed == {}, result.stdout + result.stderr
