"""Checked by `mypy --strict` in test_gateway_typing.py, which expects it to FAIL: a class
without the Protocol's `subscribe`, and one whose `cancel` lacks `compensate`, are not
`RunGateway`s (so the conformance checks of gateway_sample.py can fail)."""

from __future__ import annotations

from durably import Client, RunGateway, RunResult


class NoSubscribe(Client):
    subscribe = None  # type: ignore[assignment]


class NarrowCancel(Client):
    async def cancel(self, run_id: str) -> RunResult | None:  # type: ignore[override]
        return None


def refused(a: NoSubscribe, b: NarrowCancel) -> None:
    first: RunGateway = a
    second: RunGateway = b
    del first, second
