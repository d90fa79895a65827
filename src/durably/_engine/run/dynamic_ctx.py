"""`durably.DynamicWorkflowCtx`: the workflow context addressed by names.

`WorkflowCtx` is typed for code that holds its steps and workflows as objects
(`ctx.step(charge_card, order)` keeps the step's input and output types). Code that only
knows names at run time — an interpreter of a graph a user drew, a rules engine, a test
fake that records what a body asked for — needs one signature per primitive with the step
or workflow given as a string and the values as `Any`. That is this Protocol:

- every `WorkflowCtx` is a `DynamicWorkflowCtx` (checked by mypy in tests/typing), so an
  interpreter typed against it runs as a real workflow body;
- a fake implementing these methods is one too, so the same interpreter is unit-tested
  without an engine.

`step` is kept loose (`step(name, /, *args, **kwargs)`): what a step takes besides its
name is the step's business (its input, and the options `WorkflowCtx.step` documents).
The other primitives take their values positionally (an implementation may name its
parameters as it likes) and the options an interpreter needs by keyword; a fan's per-step
options (`ctx.all(name, inputs, retries=…)`) are `WorkflowCtx`'s, not part of this Protocol.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Protocol

from durably._core.durations import Duration

if TYPE_CHECKING:
    from durably._engine.run.fans import Settled

__all__ = ["DynamicWorkflowCtx"]


class DynamicWorkflowCtx(Protocol):
    """The name-addressed workflow context (module description). Each method does what the
    `WorkflowCtx` method of the same name documents."""

    # ------------------------------------------------------------------ identity

    @property
    def run_id(self) -> str: ...

    @property
    def workflow(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def is_replaying(self) -> bool: ...

    @property
    def logger(self) -> logging.Logger | logging.LoggerAdapter[Any]: ...

    # ------------------------------------------------------------------ steps

    def step(self, step: str, /, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        """Run the step named `step` (`ctx.step(name, input, retries=…, timeout=…)`)."""
        ...

    def local_step(self, name: str, fn: Callable[..., Any], /) -> Awaitable[Any]: ...

    def side_effect(self, fn: Callable[[], Any], /) -> Awaitable[Any]: ...

    def now(self) -> Awaitable[datetime]: ...

    # ------------------------------------------------------------------ timers

    def sleep(self, duration: Duration, /) -> Awaitable[None]: ...

    def sleep_until(self, when: datetime | int | float, /) -> Awaitable[None]: ...

    # ------------------------------------------------------------------ signals and events

    def wait_for_signal(
        self, token: str, /, *, timeout: Duration | None = None
    ) -> Awaitable[Any]: ...

    def on_update(self, name: str, /, *, timeout: Duration | None = None) -> Awaitable[Any]: ...

    def wait_for_event(
        self,
        name: str,
        /,
        *,
        match: Mapping[str, Any] | None = None,
        timeout: Duration | None = None,
    ) -> Awaitable[Any]: ...

    def set_event(self, key: str, value: Any, /) -> Awaitable[None]: ...

    # ------------------------------------------------------------------ children and fans

    def child(
        self,
        workflow: str,
        input: Any = None,
        /,
        *,
        id: str | None = None,
        version: str | None = None,
        priority: int | None = None,
    ) -> Awaitable[Any]: ...

    def start_child(
        self,
        workflow: str,
        input: Any = None,
        /,
        *,
        id: str | None = None,
        version: str | None = None,
        priority: int | None = None,
    ) -> Awaitable[str]: ...

    def all(
        self,
        target: str,
        inputs: Iterable[Any],
        /,
        *,
        mode: Literal["wait_all", "fail_fast"] = "wait_all",
        concurrency: int | None = None,
    ) -> Awaitable[Sequence[Any]]: ...

    def all_settled(
        self,
        target: str,
        inputs: Iterable[Any],
        /,
        *,
        concurrency: int | None = None,
    ) -> Awaitable[Sequence[Settled[Any]]]: ...

    # ------------------------------------------------------------------ operator hooks

    def breakpoint(self, label: str | None = None, /) -> Awaitable[None]: ...

    def patched(self, patch_id: str, /) -> Awaitable[bool]: ...

    def continue_as_new(self, input: Any = None, /) -> NoReturn: ...

    def upsert_search_attributes(
        self, attrs: Mapping[str, str | int | float | bool], /
    ) -> Awaitable[None]: ...
