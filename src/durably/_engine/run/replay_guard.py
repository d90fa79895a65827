"""Replay-only turns: turns that serve recorded results and never execute a step body.

The testing kit's `Replayer` drives a recorded run through an ordinary engine over an
in-memory copy of its history. Every position the history recorded is answered from it
by the usual replay path; a position it did not record means the code wants to do work the
recorded run never did. In a replay that work must not happen (a step body may charge a
card), so, before a step or local-step body would run, the turn asks the guard set for its
context, which records what the code wanted and holds the turn there until the replay is
torn down. Turns outside a replay (no guard set) are not affected.

The guard is a context variable rather than an engine option because only the Replayer's
own engine is ever built inside it: the tasks of that engine inherit the context the
Replayer opened it in, and no other engine in the process can see it.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol

__all__ = ["REPLAY_GUARD", "ReplayGuard"]


class ReplayGuard(Protocol):
    async def new_work(self, run_id: str, seq: int, name: str) -> None:
        """Called where a body would run at `seq`; does not return while the replay lives."""
        ...


REPLAY_GUARD: ContextVar[ReplayGuard | None] = ContextVar("durably_replay_guard", default=None)
