"""mypy sees every option: a typo, an option of a missing feature or a wrong type in
`Engine(...)`, `Client(...)` or `EngineOptions(...)` is a type error, and correct calls
type-check cleanly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).with_name("options_sample.py")
MARK = "# mypy-error: "


@pytest.mark.timeout(300)
def test_mypy_reports_exactly_the_marked_option_mistakes() -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    expected = {n: line.split(MARK, 1)[1] for n, line in enumerate(lines, 1) if MARK in line}
    assert len(expected) >= 10  # the sample really holds mistakes to catch
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(SAMPLE)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    reported: dict[int, list[str]] = {}
    for line in result.stdout.splitlines():
        match = re.match(r".*options_sample\.py:(\d+): error: (.*)", line)
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
