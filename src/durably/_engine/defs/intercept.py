"""Interceptors: user hooks around each step attempt, each workflow turn and each client call.

An `Interceptor` subclass overrides the hooks it needs; each hook receives a frozen info
object and `call_next`, and must await `call_next()` once and return its result. Several
interceptors compose outermost first (the first of the list sees the call first and its
result last). Because the hooks run in the task that then runs the user's code, a
contextvar (an APM scope, a logging context) an interceptor sets before `call_next()` is
visible in the step or workflow body — a sync step body too: the engine copies the context
into its thread-pool call.

`Interceptors` is the runtime's chain. With no interceptor each call site pays one check
(`if not chain`): no info object is built.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from durably._core.errors import StepFailedError
from durably._core.models import StepError
from durably._engine.defs.vocab import PARENT_TAG_PREFIX

if TYPE_CHECKING:
    from durably._core.models import WorkflowRun
    from durably._core.wire import RemoteTask

__all__ = [
    "NO_INTERCEPTORS",
    "ClientCallInfo",
    "Interceptor",
    "Interceptors",
    "StepCallInfo",
    "StepKind",
    "TurnInfo",
]

T = TypeVar("T")
P = ParamSpec("P")

StepKind = Literal["step", "local", "dispatch", "served"]
"""Where a step attempt runs: `step` (a `ctx.step` run in this process), `local` (a
`ctx.local_step`, `side_effect` or `now`), `dispatch` (a `ctx.step` sent to a step worker over
a transport: the hook wraps the send, not the remote body), `served` (a step this process
serves for a run driven elsewhere)."""


@dataclass(frozen=True, slots=True)
class StepCallInfo:
    """One step attempt, as an interceptor sees it."""

    run_id: str
    workflow: str | None
    """The run's workflow (None for a `served` step: the task does not carry it)."""
    namespace: str | None
    step: str
    """The step's name."""
    seq: int
    """The step's position in its run."""
    attempt: int
    kind: StepKind
    traceparent: str | None = None
    """For a `served` step: the W3C `traceparent` the dispatching engine sent with the task."""


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """One turn of a workflow body in this process (from its claim to its suspend or end)."""

    run_id: str
    workflow: str
    namespace: str | None
    parent_run_id: str | None
    """The run that started this one as a child, when it is one."""
    resumed: bool
    """False for the run's first turn (it has no checkpoint yet), True for a later one."""


ClientVerb = Literal[
    "start",
    "signal",
    "signal_with_start",
    "cancel",
    "retry",
    "retry_with_input",
    "continue_run",
    "delete_run",
]


@dataclass(frozen=True, slots=True)
class ClientCallInfo:
    """One call of a `Client` (or `Engine`) verb that changes runs."""

    verb: ClientVerb
    namespace: str | None
    """The client's namespace."""
    run_id: str | None = None
    """The run the call names, when it names one (a `start` without `run_id=` does not)."""
    workflow: str | None = None
    """The workflow a start names."""
    token: str | None = None
    """The token a signal names."""


class Interceptor:
    """Base class of interceptors: every hook passes the call through. Override the hooks
    you need; each must await `call_next()` exactly once and return what it returned (or
    raise). Give instances as `Engine(interceptors=[...])` / `Client(interceptors=[...])`."""

    async def intercept_step(
        self, info: StepCallInfo, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Around one step attempt (see `StepCallInfo.kind` for which). A failed attempt
        raises out of `call_next()` (a `durably.StepFailedError` carrying the step's error
        when the step's own body failed): let it propagate. A step served from its
        checkpoint on replay is not an attempt: no hook runs for it."""
        return await call_next()

    async def intercept_turn(
        self, info: TurnInfo, call_next: Callable[[], Awaitable[None]]
    ) -> None:
        """Around one turn of a workflow body executed in this process."""
        await call_next()

    async def intercept_client(
        self, info: ClientCallInfo, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Around one client call that changes runs (start, signal, cancel, …)."""
        return await call_next()

    def traceparent(self) -> str | None:
        """The W3C `traceparent` to carry on a step task about to be sent to a step worker,
        read inside this interceptor's `dispatch` scope; None: none. The first interceptor
        (outermost) that answers one wins."""
        return None


class Interceptors:
    """The chain of an engine's or a client's interceptors (falsy when empty)."""

    __slots__ = ("_items",)

    def __init__(self, items: Sequence[Interceptor] = ()):
        self._items = tuple(items)

    @classmethod
    def of(cls, items: object, where: str) -> Interceptors:
        """Check `items` (a list or tuple of `Interceptor` instances) for `where`."""
        if items is None:
            return NO_INTERCEPTORS
        if isinstance(items, Interceptors):
            return items
        if not isinstance(items, (list, tuple)):
            raise TypeError(
                f"{where}(interceptors=...) must be a list of durably.Interceptor, "
                f"not {type(items).__name__}"
            )
        for item in items:
            if not isinstance(item, Interceptor):
                raise TypeError(
                    f"{where}(interceptors=...): {item!r} is not a durably.Interceptor "
                    "(subclass it and override the hooks you need)"
                )
        return cls(items) if items else NO_INTERCEPTORS

    def __bool__(self) -> bool:
        return bool(self._items)

    @property
    def items(self) -> tuple[Interceptor, ...]:
        return self._items

    async def step(
        self,
        run: WorkflowRun,
        seq: int,
        name: str,
        attempt: int,
        kind: StepKind,
        call: Callable[P, Awaitable[T]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """`call(*args, **kwargs)` inside every interceptor's `intercept_step` for attempt
        `attempt` of step `name` at `seq` of `run` (no info is built without interceptors)."""
        if not self._items:
            return await call(*args, **kwargs)
        info = StepCallInfo(
            run_id=run.id,
            workflow=run.workflow,
            namespace=run.namespace,
            step=name,
            seq=seq,
            attempt=attempt,
            kind=kind,
        )
        return await self._step(info, call, *args, **kwargs)

    async def served(
        self,
        task: RemoteTask,
        namespace: str | None,
        call: Callable[P, Awaitable[T]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """As `step`, for a step task this process serves."""
        if not self._items:
            return await call(*args, **kwargs)
        info = StepCallInfo(
            run_id=task.run_id,
            workflow=None,
            namespace=namespace,
            step=task.name,
            seq=task.seq,
            attempt=task.attempt,
            kind="served",
            traceparent=task.traceparent,
        )
        return await self._step(info, call, *args, **kwargs)

    async def _step(
        self,
        info: StepCallInfo,
        call: Callable[P, Awaitable[T]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        async def innermost() -> Any:
            result = await call(*args, **kwargs)
            # A handler's failure comes back as (None, error) from the runners of `step` and
            # `served` attempts: raised here, so every interceptor sees a failed attempt as
            # an exception, and turned back into the pair once it leaves the chain.
            if info.kind in _RETURNS_ERRORS and isinstance(result, tuple):
                error = result[1]
                if isinstance(error, StepError):
                    raise _AttemptFailed(error, result)
            return result

        nxt: Callable[[], Awaitable[Any]] = innermost
        for item in reversed(self._items):
            nxt = _bind(item.intercept_step, info, nxt)
        try:
            result: T = await nxt()
        except _AttemptFailed as failed:
            return failed.result  # type: ignore[return-value]
        return result

    async def turn(
        self,
        run: WorkflowRun,
        resumed: bool,
        call: Callable[P, Awaitable[None]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> None:
        """`call(*args, **kwargs)` (one turn of `run`) inside every `intercept_turn`."""
        if not self._items:
            return await call(*args, **kwargs)
        parent = next(
            (
                t[len(PARENT_TAG_PREFIX) :]
                for t in run.tags or ()
                if t.startswith(PARENT_TAG_PREFIX)
            ),
            None,
        )
        info = TurnInfo(
            run_id=run.id,
            workflow=run.workflow,
            namespace=run.namespace,
            parent_run_id=parent,
            resumed=resumed,
        )

        async def innermost() -> None:
            await call(*args, **kwargs)

        nxt: Callable[[], Awaitable[None]] = innermost
        for item in reversed(self._items):
            nxt = _bind(item.intercept_turn, info, nxt)
        await nxt()

    async def client(self, info: ClientCallInfo, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` inside every interceptor's `intercept_client`."""
        if not self._items:
            return await call()
        nxt: Callable[[], Awaitable[Any]] = call
        for item in reversed(self._items):
            nxt = _bind(item.intercept_client, info, nxt)
        result: T = await nxt()
        return result

    def traceparent(self) -> str | None:
        for item in self._items:
            found = item.traceparent()
            if found is not None:
                return found
        return None


_RETURNS_ERRORS = frozenset({"step", "served"})


class _AttemptFailed(StepFailedError):
    """A failed step attempt as interceptors see it (a `StepFailedError` with its error)."""

    def __init__(self, error: StepError, result: object):
        super().__init__(error)
        self.result = result


def _bind(
    hook: Callable[[Any, Callable[[], Awaitable[Any]]], Awaitable[Any]],
    info: object,
    nxt: Callable[[], Awaitable[Any]],
) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        return await hook(info, nxt)

    return call


NO_INTERCEPTORS = Interceptors()
