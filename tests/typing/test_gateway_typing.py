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
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(HERE.parent / sample)],
        capture_output=True,
        text=True,
        cwd=HERE.parents[1],
    )


@pytest.mark.timeout(300)
def test_client_engine_and_tenant_gateway_are_run_gateways() -> None:
    result = mypy("typing/gateway_sample.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout


@pytest.mark.timeout(300)
def test_a_type_without_the_protocols_verbs_is_not_a_run_gateway() -> None:
    result = mypy("typing/gateway_bad_sample.py")
    assert result.returncode == 1, result.stdout + result.stderr
    for refused, protocol in (
        ("NoSubscribe", "RunGateway"),
        ("NarrowCancel", "RunGateway"),
        ("StepsOnly", "DynamicWorkflowCtx"),
    ):
        wanted = f'(expression has type "{refused}", variable has type "{protocol}")'
        assert wanted in result.stdout, result.stdout
    assert result.stdout.count("error:") == 3, result.stdout


@pytest.mark.timeout(300)
def test_every_workflow_ctx_and_the_test_fake_are_dynamic_workflow_ctxs() -> None:
    # tests/run/graph_interpreter.py assigns a `WorkflowCtx` and its `FakeCtx` to
    # `DynamicWorkflowCtx` and types its interpreter against the Protocol.
    result = mypy("run/graph_interpreter.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout
