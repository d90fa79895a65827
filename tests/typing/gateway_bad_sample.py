"""Checked by `mypy --strict` in test_gateway_typing.py, which expects it to FAIL: a class
without the Protocol's `subscribe`, and one whose `cancel` lacks `compensate`, are not
`RunGateway`s, and a class with only `step` is not a `DynamicWorkflowCtx` (so the
conformance checks of gateway_sample.py and tests/run/graph_interpreter.py can fail)."""

from __future__ import annotations

from durably import Client, DynamicWorkflowCtx, RunGateway, RunResult


class NoSubscribe(Client):
    subscribe = None  # type: ignore[assignment]


class NarrowCancel(Client):
    async def cancel(self, run_id: str) -> RunResult | None:  # type: ignore[override]
        return None


def refused(a: NoSubscribe, b: NarrowCancel) -> None:
    first: RunGateway = a
    second: RunGateway = b
    del first, second


class StepsOnly:
    """Only `step`: not a `DynamicWorkflowCtx` (it lacks the other primitives)."""

    async def step(self, step: str, /, *args: object, **kwargs: object) -> object:
        return None


def not_a_ctx(ctx: StepsOnly) -> None:
    third: DynamicWorkflowCtx = ctx
    del third
