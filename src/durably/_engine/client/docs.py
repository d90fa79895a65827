"""`documented_by`: a public method that hands its call to a part says what that part does.

`Client` and `Engine` answer most of their public methods through small parts (the reads of
a store, the signal buffer, …). The part's method holds the documentation, and each public
method that forwards to it takes that text, so the same words are never kept in two places
that could drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["documented_by"]

F = TypeVar("F", bound=Callable[..., Any])


def documented_by(source: Callable[..., Any]) -> Callable[[F], F]:
    """Give the decorated function `source`'s docstring (nothing else changes)."""

    def document(method: F) -> F:
        method.__doc__ = source.__doc__
        return method

    return document
