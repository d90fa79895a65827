"""Step bodies that fail on purpose: `fail_once` and `fail_times` give a body that raises on
its first calls and then returns a value, to test retries against a real engine."""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["fail_once", "fail_times"]

T = TypeVar("T")

ErrorSpec = BaseException | type[BaseException] | None


def _error_for(error: ErrorSpec, call: int, failures: int) -> BaseException:
    if error is None:
        return RuntimeError(f"injected failure {call} of {failures}")
    if isinstance(error, BaseException):
        return error
    if isinstance(error, type) and issubclass(error, BaseException):
        return error(f"injected failure {call} of {failures}")
    raise TypeError(f"error must be an exception instance or class, not {error!r}")


def fail_times(n: int, value: T, error: ErrorSpec = None) -> Callable[..., Coroutine[Any, Any, T]]:
    """An async step body that raises `error` on its first `n` calls, then returns `value`
    on every later call.

    `error` is an exception instance (raised as is each time) or class (built with a
    message naming the call), by default a `RuntimeError("injected failure 1 of n")`.
    The body takes any arguments and ignores them; each body returned has its own counter,
    safe to call from several threads. Use it as `durably.step("charge", retries=3)(
    fail_times(2, "ok"))`: the first two attempts fail and the third returns `"ok"`."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"fail_times(n={n!r}): a whole number >= 0")
    _error_for(error, 1, max(n, 1))  # a wrong `error` is refused here, not at the first call
    lock = threading.Lock()
    calls = 0

    async def body(*args: Any, **kwargs: Any) -> T:
        nonlocal calls
        with lock:
            calls += 1
            call = calls
        if call <= n:
            raise _error_for(error, call, n)
        return value

    body.__qualname__ = body.__name__ = f"fail_times_{n}"
    return body


def fail_once(value: T, error: ErrorSpec = None) -> Callable[..., Coroutine[Any, Any, T]]:
    """An async step body that raises `error` on its first call, then returns `value`
    (`fail_times(1, value, error)`)."""
    return fail_times(1, value, error)
