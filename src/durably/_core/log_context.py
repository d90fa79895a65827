"""The run context of log records: which run, workflow, step and position a record was
logged under, as attributes of the stdlib `LogRecord` (`run_id`, `workflow`, `step`, `seq`).

The engine binds the context (a contextvar) around a workflow turn and around each step
attempt; `RunContextFilter` copies it onto records. durably's own loggers carry the filter
(`durably_logger`); a user's logger gets it by adding `durably.RunContextFilter()` to a
handler or logger. Asyncio tasks and the thread pool of sync steps see the context because
contextvars are copied into both.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace

__all__ = [
    "FIELDS",
    "LogContext",
    "RunContextFilter",
    "current_log_context",
    "durably_logger",
    "run_logging",
    "step_logging",
]

# The attributes a record gets; every one is set (None when it does not apply), so a format
# string naming them never fails on a record logged outside a run.
FIELDS = ("run_id", "workflow", "step", "seq")


@dataclass(frozen=True, slots=True)
class LogContext:
    """What a record logged now was logged under."""

    run_id: str
    workflow: str | None = None
    step: str | None = None
    seq: int | None = None


_CONTEXT: ContextVar[LogContext | None] = ContextVar("durably_log_context", default=None)


def current_log_context() -> LogContext | None:
    return _CONTEXT.get()


@contextmanager
def run_logging(run_id: str, workflow: str | None) -> Iterator[None]:
    """Records logged inside carry this run (a workflow turn)."""
    token = _CONTEXT.set(LogContext(run_id, workflow))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


@contextmanager
def step_logging(run_id: str, workflow: str | None, step: str, seq: int) -> Iterator[None]:
    """Records logged inside carry this step attempt too."""
    outer = _CONTEXT.get()
    base = outer if outer is not None and outer.run_id == run_id else LogContext(run_id)
    token = _CONTEXT.set(replace(base, workflow=workflow or base.workflow, step=step, seq=seq))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


class RunContextFilter(logging.Filter):
    """Adds `run_id`, `workflow`, `step` and `seq` to each record it sees (None outside a
    run or step). It never drops a record. A value the caller gave in `extra=` is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _CONTEXT.get()
        values = (
            (None, None, None, None)
            if ctx is None
            else (
                ctx.run_id,
                ctx.workflow,
                ctx.step,
                ctx.seq,
            )
        )
        attrs = record.__dict__
        for key, value in zip(FIELDS, values, strict=True):
            if attrs.get(key) is None:
                attrs[key] = value
        return True


_FILTER = RunContextFilter()


def durably_logger(name: str) -> logging.Logger:
    """One of durably's loggers (`name` under "durably"), carrying the run context filter.
    A logger's filters apply to the records logged on it, so each of durably's loggers
    carries it (not only "durably", which its children's records reach without filtering)."""
    if name != "durably" and not name.startswith("durably."):
        raise ValueError(f"durably's loggers live under 'durably', not {name!r}")
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
