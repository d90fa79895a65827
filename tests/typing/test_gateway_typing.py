"""`RunGateway` and `DynamicWorkflowCtx` are met by the types that must meet them, under
`mypy --strict` — and a type that does not meet them is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def mypy(sample: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(HERE / sample)],
        capture_output=True,
        text=True,
        cwd=HERE.parents[1],
    )


@pytest.mark.timeout(300)
def test_client_engine_and_tenant_gateway_are_run_gateways() -> None:
    result = mypy("gateway_sample.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout


@pytest.mark.timeout(300)
def test_a_type_without_the_protocols_verbs_is_not_a_run_gateway() -> None:
    result = mypy("gateway_bad_sample.py")
    assert result.returncode == 1, result.stdout + result.stderr
    for refused in ("NoSubscribe", "NarrowCancel"):
        wanted = f'(expression has type "{refused}", variable has type "RunGateway")'
        assert wanted in result.stdout, result.stdout
    assert result.stdout.count("error:") == 2, result.stdout
