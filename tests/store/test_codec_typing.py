"""mypy sees the derived `CodecStateStore` as a `StateStore` with the contract's method
types (its methods are generated at import, so the types come from its `StateStore` base):
correct calls type-check cleanly and the marked mistakes in the sample are reported."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).with_name("codec_typing_sample.py")
MARK = "# mypy-error: "


@pytest.mark.timeout(300)
def test_mypy_types_the_derived_wrapper_as_a_state_store() -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    expected = {n: line.split(MARK, 1)[1] for n, line in enumerate(lines, 1) if MARK in line}
    assert len(expected) == 4
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(SAMPLE)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
        timeout=280,
    )
    reported: dict[int, list[str]] = {}
    for line in result.stdout.splitlines():
        match = re.match(r".*codec_typing_sample\.py:(\d+): error: (.*)", line)
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
