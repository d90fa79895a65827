"""`StepContext`: the step logger a step handler is given (a parameter annotated
`StepContext`, or `durably.current_step()`) and the `log` of a local step.

It records `StepEvent`s — log lines and sub-process outcomes, in the shapes durable-worker
sends — that are checkpointed with the step attempt and streamed live as `step.progress`
engine events. The events of one attempt are bounded (`MAX_STEP_EVENTS` events, messages of
`MAX_MESSAGE_CHARS`, data of `MAX_DATA_BYTES` as JSON), so a chatty loop cannot grow a
checkpoint without end.

A sync step runs on a thread of the engine's pool, so the recording side takes a lock and
live events are handed to the loop thread that created the context.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
import typing
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any

from durably._core.models import JSONValue, StepEvent

__all__ = [
    "MAX_DATA_BYTES",
    "MAX_MESSAGE_CHARS",
    "MAX_STEP_EVENTS",
    "StepContext",
    "SubProcess",
    "current_step",
    "step_context_param",
    "step_scope",
    "with_step_context",
]

# At most this many events are kept per attempt; past it events are dropped and the last
# kept event says how many were (a `warn` line).
MAX_STEP_EVENTS = 500
# A longer message is cut to this many characters (with "…").
MAX_MESSAGE_CHARS = 2000
# `data` larger than this as JSON is replaced by `{"truncated": true, "bytes": n}`.
MAX_DATA_BYTES = 8192

_LEVELS = ("debug", "info", "warn", "error")
_TERMINALS = ("ok", "failed", "skipped")


def _wall_ms() -> int:
    return int(time.time() * 1000)


class StepContext:
    """What a step handler records about its attempt: log lines (`debug`, `info`, `warn`,
    `error`), sub-process outcomes (`sub`, `sub_event`, `sub_process`). `run_id`, `seq`,
    `name` and `attempt` say which attempt it is."""

    def __init__(
        self,
        run_id: str,
        seq: int,
        name: str,
        attempt: int = 1,
        *,
        workflow: str | None = None,
        clock: Callable[[], int] = _wall_ms,
        on_event: Callable[[StepEvent], None] | None = None,
    ):
        self.run_id = run_id
        self.seq = seq
        self.name = name
        self.attempt = attempt
        self.workflow = workflow
        self._clock = clock
        self._on_event = on_event
        self._lock = threading.Lock()
        self._events: list[StepEvent] = []
        self._dropped = 0
        self._active: SubProcess | None = None
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._loop_thread = threading.get_ident()

    def __repr__(self) -> str:
        return f"<durably.StepContext {self.name!r} run={self.run_id!r} seq={self.seq}>"

    # ------------------------------------------------------------------ what was recorded

    @property
    def events(self) -> tuple[StepEvent, ...]:
        """The events recorded so far (with the dropped-events line past the cap)."""
        with self._lock:
            kept = tuple(self._events)
            dropped = self._dropped
        if not dropped:
            return kept
        note = StepEvent(
            at=kept[-1].at if kept else self._clock(),
            level="warn",
            message=(
                f"{dropped} more step event(s) dropped: at most {MAX_STEP_EVENTS} are kept "
                "per attempt"
            ),
            data={"dropped": dropped},
        )
        return (*kept, note)

    # ------------------------------------------------------------------ log lines

    def debug(self, message: str, data: JSONValue = None) -> None:
        self._log("debug", message, data)

    def info(self, message: str, data: JSONValue = None) -> None:
        self._log("info", message, data)

    def warn(self, message: str, data: JSONValue = None) -> None:
        self._log("warn", message, data)

    warning = warn

    def error(self, message: str, data: JSONValue = None) -> None:
        self._log("error", message, data)

    def _log(self, level: str, message: str, data: JSONValue) -> None:
        active = self._active
        self.record(
            level,
            message,
            data=data,
            sub_id=active.id if active is not None else None,
        )

    # ------------------------------------------------------------------ sub-processes

    def sub(
        self, name: str, status: str, message: str | None = None, data: JSONValue = None
    ) -> None:
        """The terminal outcome (`ok`, `failed`, `skipped`) of the sub-process `name`."""
        self.sub_event(name, name, status=status, message=message, data=data)

    def sub_event(
        self,
        id: str,
        name: str,
        group: str | None = None,
        phase: str | None = None,
        status: str | None = None,
        message: str | None = None,
        data: JSONValue = None,
    ) -> None:
        """One event of the sub-process `id`: a `phase` (an intermediate transition) or a
        terminal `status` (`ok`, `failed`, `skipped`)."""
        if status is not None and status not in _TERMINALS:
            raise ValueError(f"sub-process status must be one of {_TERMINALS}, not {status!r}")
        level = "error" if status == "failed" else "warn" if status == "skipped" else "info"
        self.record(
            level,
            message if message is not None else name,
            data=data,
            sub_id=id,
            name=name,
            group=group,
            phase=phase,
            status=status,
        )

    def sub_process(self, name: str, group: str | None = None, id: str | None = None) -> SubProcess:
        """A context manager around one sub-process: `ok` (with `durationMs`) on a clean
        exit, `failed` (the exception's text, re-raised) on an exception, unless `skip` or
        `fail` said first. Log lines inside are tagged with its id."""
        return SubProcess(self, name, group, id or str(uuid.uuid4()))

    # ------------------------------------------------------------------ recording

    def now(self) -> int:
        """The clock events are stamped with (epoch ms)."""
        return self._clock()

    def swap_sub(self, sub: SubProcess | None) -> SubProcess | None:
        """Make `sub` the sub-process log lines are tagged with; the previous one."""
        previous, self._active = self._active, sub
        return previous

    def record(
        self,
        level: str,
        message: str,
        *,
        data: JSONValue = None,
        sub_id: str | None = None,
        name: str | None = None,
        group: str | None = None,
        phase: str | None = None,
        status: str | None = None,
    ) -> None:
        if level not in _LEVELS:
            raise ValueError(f"step event level must be one of {_LEVELS}, not {level!r}")
        if not isinstance(message, str):
            message = str(message)
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 1] + "…"
        event = StepEvent(
            at=self._clock(),
            level=level,
            message=message,
            sub_id=sub_id,
            name=name,
            group=group,
            status=status,
            phase=phase,
            data=_bounded_data(data),
        )
        with self._lock:
            if len(self._events) >= MAX_STEP_EVENTS - 1:
                self._dropped += 1
                return
            self._events.append(event)
        self._stream(event)

    def _stream(self, event: StepEvent) -> None:
        listener = self._on_event
        if listener is None:
            return
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            listener(event)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(listener, event)


def _bounded_data(data: JSONValue) -> JSONValue:
    if data is None:
        return None
    try:
        text = json.dumps(data)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"step event data must be JSON (dict, list, str, number): {exc}") from exc
    size = len(text.encode())
    if size > MAX_DATA_BYTES:
        return {"truncated": True, "bytes": size}
    return data


class SubProcess:
    """One sub-process of a step (`StepContext.sub_process`)."""

    def __init__(self, step: StepContext, name: str, group: str | None, id: str):
        self.step = step
        self.name = name
        self.group = group
        self.id = id
        self._started: int | None = None
        self._done = False
        self._previous: SubProcess | None = None

    def phase(self, label: str, data: JSONValue = None) -> None:
        """An intermediate transition of this sub-process."""
        self.step.sub_event(self.id, self.name, group=self.group, phase=label, data=data)

    def skip(self, reason: str | None = None) -> None:
        """End it `skipped` (the first terminal wins)."""
        self._end("skipped", reason, None)

    def fail(self, reason: str | None = None) -> None:
        """End it `failed` without raising (the first terminal wins)."""
        self._end("failed", reason, None)

    def _end(self, status: str, message: str | None, data: JSONValue) -> None:
        if self._done:
            return
        self._done = True
        self.step.sub_event(
            self.id, self.name, group=self.group, status=status, message=message, data=data
        )

    def __enter__(self) -> SubProcess:
        self._started = self.step.now()
        self._previous = self.step.swap_sub(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.step.swap_sub(self._previous)
        if exc is not None:
            self._end("failed", str(exc) or type(exc).__name__, None)
            return
        started = self._started if self._started is not None else self.step.now()
        self._end("ok", None, {"durationMs": self.step.now() - started})


# ---------------------------------------------------------------------- the ambient step

_CURRENT: ContextVar[StepContext | None] = ContextVar("durably_step", default=None)


def current_step() -> StepContext:
    """The `StepContext` of the step attempt running now (a `@step` handler or a local
    step, sync or async). A RuntimeError outside one."""
    step = _CURRENT.get()
    if step is None:
        raise RuntimeError(
            "durably.current_step() was called outside a step: it is only available while a "
            "step handler (or a local step) runs"
        )
    return step


@contextmanager
def step_scope(step: StepContext) -> Iterator[StepContext]:
    """`current_step()` is `step` inside (and in the threads and tasks started inside)."""
    token = _CURRENT.set(step)
    try:
        yield step
    finally:
        _CURRENT.reset(token)


def _ambient_or_detached(name: str) -> StepContext:
    # A handler called directly (a unit test calling the function) still gets a context;
    # what it records goes nowhere.
    step = _CURRENT.get()
    return step if step is not None else StepContext("", -1, name)


def step_context_param(fn: Callable[..., Any]) -> str | None:
    """The parameter of `fn` annotated `StepContext` (None when it has none). Refused when
    it cannot be passed by keyword after the inputs (a TypeError at declaration)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    found = [
        p
        for p in signature.parameters.values()
        if hints.get(p.name) is StepContext
        or (isinstance(p.annotation, str) and p.annotation.split(".")[-1] == "StepContext")
    ]
    if not found:
        return None
    name = getattr(fn, "__qualname__", repr(fn))
    if len(found) > 1:
        raise TypeError(f"step {name}: only one parameter may be annotated StepContext")
    param = found[0]
    params = list(signature.parameters.values())
    after = params[params.index(param) + 1 :]
    positional_after = [p for p in after if p.kind in (p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if param.kind is param.POSITIONAL_ONLY or (
        param.kind is param.POSITIONAL_OR_KEYWORD and positional_after
    ):
        raise TypeError(
            f"step {name}: the StepContext parameter {param.name!r} must come after the "
            "step's inputs (or be keyword-only), since it is passed by keyword"
        )
    return param.name


def with_step_context(fn: Callable[..., Any], param: str, step_name: str) -> Callable[..., Any]:
    """`fn` without its StepContext parameter: the inputs' signature and types (what the
    codecs read), calling `fn` with the running step's context."""
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    shim: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):

        async def shim(*args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs, **{param: _ambient_or_detached(step_name)})

    else:

        def shim(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs, **{param: _ambient_or_detached(step_name)})

    shim.__signature__ = signature.replace(  # type: ignore[union-attr]
        parameters=[p for p in signature.parameters.values() if p.name != param]
    )
    shim.__annotations__ = {k: v for k, v in hints.items() if k != param}
    shim.__name__ = getattr(fn, "__name__", step_name)
    shim.__qualname__ = getattr(fn, "__qualname__", step_name)
    shim.__module__ = getattr(fn, "__module__", __name__)
    shim.__doc__ = fn.__doc__
    return shim
