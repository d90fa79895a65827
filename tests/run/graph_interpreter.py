"""An interpreter of user-defined graphs, typed against `durably.DynamicWorkflowCtx`, and a
fake context implementing the Protocol.

Checked by `mypy --strict` in tests/typing/test_gateway_typing.py (the fake and every
`WorkflowCtx` are `DynamicWorkflowCtx`s); run by tests/run/test_dynamic_ctx.py both as a
real workflow body and against the fake.

A graph is a list of nodes applied in order to a running value:
`{"op": "step", "name": N}` (the value through step N), `{"op": "all", "name": N}` (step N
over every item of the value), `{"op": "settled", "name": N}` (the same, a failed item
becoming None), `{"op": "child", "name": W}` (the value through workflow W),
`{"op": "signal", "token": T}` (the value paired with signal `T:<run id>`'s payload),
`{"op": "sleep", "seconds": S}`, `{"op": "event", "key": K}` (the value published as K),
`{"op": "patched", "id": P}` (the value, with the patch's verdict when it is new code).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NoReturn

from durably import DynamicWorkflowCtx, Fulfilled, Rejected, Settled, WorkflowCtx
from durably._core.durations import Duration

Graph = list[dict[str, Any]]


async def interpret(ctx: DynamicWorkflowCtx, graph: Graph, value: Any) -> Any:
    for node in graph:
        op = node["op"]
        if op == "step":
            value = await ctx.step(node["name"], value, retries=node.get("retries"))
        elif op == "all":
            value = await ctx.all(node["name"], list(value))
        elif op == "settled":
            outcomes = await ctx.all_settled(node["name"], list(value))
            value = [o.value if isinstance(o, Fulfilled) else None for o in outcomes]
        elif op == "child":
            value = await ctx.child(node["name"], value)
        elif op == "signal":
            value = [value, await ctx.wait_for_signal(f"{node['token']}:{ctx.run_id}")]
        elif op == "sleep":
            await ctx.sleep(node["seconds"])
        elif op == "event":
            await ctx.set_event(node["key"], value)
        elif op == "patched":
            value = [value, await ctx.patched(node["id"])]
        else:
            raise ValueError(f"unknown graph node {op!r}")
    ctx.logger.info("graph of %d nodes done", len(graph))
    return value


def is_dynamic(ctx: WorkflowCtx) -> DynamicWorkflowCtx:
    """Every `WorkflowCtx` is a `DynamicWorkflowCtx` (the assignment mypy checks)."""
    dynamic: DynamicWorkflowCtx = ctx
    return dynamic


async def _done(value: Any) -> Any:
    return value


class FakeCtx:
    """A `DynamicWorkflowCtx` without an engine: steps and children are plain functions by
    name, signals are given up front, and every call is recorded in `calls`."""

    def __init__(
        self,
        steps: Mapping[str, Callable[[Any], Any]],
        *,
        children: Mapping[str, Callable[[Any], Any]] | None = None,
        signals: Mapping[str, Any] | None = None,
        run_id: str = "fake-run",
    ) -> None:
        self._steps = steps
        self._children = children or {}
        self._signals = signals or {}
        self._run_id = run_id
        self.calls: list[tuple[str, Any]] = []
        self.events: dict[str, Any] = {}

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def workflow(self) -> str:
        return "fake"

    @property
    def version(self) -> str:
        return "1"

    @property
    def is_replaying(self) -> bool:
        return False

    @property
    def logger(self) -> logging.Logger:
        return logging.getLogger("tests.fake_ctx")

    def _call(self, name: str, value: Any) -> Any:
        self.calls.append((name, value))
        return self._steps[name](value)

    def step(self, step: str, /, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return _done(self._call(step, args[0] if args else kwargs.get("input")))

    def local_step(self, name: str, fn: Callable[..., Any], /) -> Awaitable[Any]:
        return _done(fn(self.logger))

    def side_effect(self, fn: Callable[[], Any], /) -> Awaitable[Any]:
        return _done(fn())

    def now(self) -> Awaitable[datetime]:
        return _done(datetime(2026, 1, 1, tzinfo=UTC))

    def sleep(self, duration: Duration, /) -> Awaitable[None]:
        self.calls.append(("sleep", duration))
        return _done(None)

    def sleep_until(self, when: datetime | int | float, /) -> Awaitable[None]:
        return _done(None)

    def wait_for_signal(self, token: str, /, *, timeout: Duration | None = None) -> Awaitable[Any]:
        self.calls.append(("signal", token))
        return _done(self._signals[token])

    def on_update(self, name: str, /, *, timeout: Duration | None = None) -> Awaitable[Any]:
        return _done(self._signals[f"update:{self._run_id}:{name}"])

    def wait_for_event(
        self,
        name: str,
        /,
        *,
        match: Mapping[str, Any] | None = None,
        timeout: Duration | None = None,
    ) -> Awaitable[Any]:
        return _done(self._signals[name])

    def set_event(self, key: str, value: Any, /) -> Awaitable[None]:
        self.events[key] = value
        return _done(None)

    def child(
        self,
        workflow: str,
        input: Any = None,
        /,
        *,
        id: str | None = None,
        version: str | None = None,
        priority: int | None = None,
    ) -> Awaitable[Any]:
        self.calls.append((f"child:{workflow}", input))
        return _done(self._children[workflow](input))

    def start_child(
        self,
        workflow: str,
        input: Any = None,
        /,
        *,
        id: str | None = None,
        version: str | None = None,
        priority: int | None = None,
    ) -> Awaitable[str]:
        return _done(id or f"{self._run_id}.child")

    def all(
        self,
        target: str,
        inputs: Iterable[Any],
        /,
        *,
        mode: Literal["wait_all", "fail_fast"] = "wait_all",
        concurrency: int | None = None,
    ) -> Awaitable[Sequence[Any]]:
        return _done([self._call(target, item) for item in inputs])

    def all_settled(
        self,
        target: str,
        inputs: Iterable[Any],
        /,
        *,
        concurrency: int | None = None,
    ) -> Awaitable[Sequence[Settled[Any]]]:
        out: list[Settled[Any]] = []
        for index, item in enumerate(inputs):
            try:
                out.append(Fulfilled(self._call(target, item)))
            except Exception as exc:
                out.append(Rejected(f"{self._run_id}:{index}", str(exc)))
        return _done(out)

    def breakpoint(self, label: str | None = None, /) -> Awaitable[None]:
        return _done(None)

    def patched(self, patch_id: str, /) -> Awaitable[bool]:
        return _done(True)

    def continue_as_new(self, input: Any = None, /) -> NoReturn:
        raise NotImplementedError("FakeCtx does not continue as new")

    def upsert_search_attributes(
        self, attrs: Mapping[str, str | int | float | bool], /
    ) -> Awaitable[None]:
        return _done(None)


def the_fake_is_dynamic(fake: FakeCtx) -> DynamicWorkflowCtx:
    """The fake is a `DynamicWorkflowCtx` (the assignment mypy checks)."""
    dynamic: DynamicWorkflowCtx = fake
    return dynamic
