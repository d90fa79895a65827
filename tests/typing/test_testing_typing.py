"""`durably.testing.WorkflowEnvironment` keeps the workflow's types under `mypy --strict`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).with_name("testing_sample.py")


@pytest.mark.timeout(300)
def test_the_environment_keeps_the_output_type_under_mypy_strict() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(SAMPLE)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout
