"""`ResidentSet`: the resident runs parked in this process, capped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Parkable(Protocol):
    """A parked run's execution, as far as the cap needs it."""

    @property
    def run_id(self) -> str: ...

    def evict(self) -> None: ...


class ResidentSet:
    """Parked resident runs in parking order, capped at `max_resident_runs`.

    A parked body costs memory (its coroutine frame) and nothing else: its state is already
    durable. Past the cap the longest-parked run is evicted — its lease is released and a
    later wake replays it — so a fleet of long waits cannot exhaust the process.
    """

    def __init__(self, cap: int, *, on_idle: Callable[[], None] = lambda: None):
        self.cap = cap
        self._parked: dict[str, Parkable] = {}
        # The executions whose bodies wait only for things outside them (a signal, a timer,
        # a child): they hold no slot under `max_concurrent_runs`. A live view is handed to
        # the dispatcher, which subtracts its size from its load. Kept by execution, not by
        # run id, like `_parked` below: the late clean-up of an ended turn must not touch
        # the next turn of the same run.
        self.idle: set[Parkable] = set()
        # A run that turns idle leaves room: told so, the worker picks up pending work at once.
        self._on_idle = on_idle

    def note_idle(self, execution: Parkable, idle: bool) -> None:
        if not idle:
            self.idle.discard(execution)
        elif execution not in self.idle:
            self.idle.add(execution)
            self._on_idle()

    def note_parked(self, execution: Parkable) -> None:
        self._parked.pop(execution.run_id, None)
        self._parked[execution.run_id] = execution
        while len(self._parked) > self.cap:
            oldest = next(iter(self._parked))
            self._parked.pop(oldest).evict()

    def note_unparked(self, execution: Parkable) -> None:
        if self._parked.get(execution.run_id) is execution:
            del self._parked[execution.run_id]

    def __len__(self) -> int:
        return len(self._parked)
