"""A live progress display fed by engine events.

On a terminal it keeps ONE status line up to date (rewritten with `\\r`), printing notable
moments (a failed attempt, a signal, a child run finishing) as permanent lines above it. When
stdout is not a terminal (CI logs, pipes) every event is one plain line instead.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

from durably._cli.render import format_duration
from durably._engine.defs.events import EngineEvent

_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class Progress:
    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.started = time.monotonic()
        self.steps_done = 0
        self.retries = 0
        self.current = "starting"
        self.state = "running"
        self._frame = 0
        self._shown = False
        self._root: str | None = None

    # ------------------------------------------------------------------ output

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started:5.2f}s"

    def _status_text(self) -> str:
        spin = _SPINNER[self._frame % len(_SPINNER)]
        self._frame += 1
        retry = ""
        if self.retries:
            retry = f" · {self.retries} retr{'y' if self.retries == 1 else 'ies'}"
        text = (
            f"{spin} {self._elapsed()}  {self.state:<9}  {self.steps_done} step"
            f"{'' if self.steps_done == 1 else 's'} done{retry}  │ {self.current}"
        )
        width = shutil.get_terminal_size((100, 20)).columns - 1
        return text if len(text) <= width else text[: max(10, width - 1)] + "…"

    def _redraw(self) -> None:
        if not self.tty:
            return
        self.stream.write("\r\x1b[K" + self._status_text())
        self.stream.flush()
        self._shown = True

    def note(self, message: str) -> None:
        """A permanent line (above the status line on a terminal)."""
        if self.tty:
            self.stream.write("\r\x1b[K" + f"  {self._elapsed().strip():>6}  {message}\n")
            self._redraw()
        else:
            self.stream.write(f"  {self._elapsed().strip():>6}  {message}\n")
            self.stream.flush()

    def tick(self) -> None:
        """Refresh the spinner/elapsed time (call periodically while waiting)."""
        self._redraw()

    def finish(self) -> None:
        """Leave the terminal on a fresh line."""
        if self.tty and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

    # ------------------------------------------------------------------ events

    def __call__(self, event: EngineEvent) -> None:
        """The engine listener."""
        if self._root is None and event.type == "run.started":
            self._root = event.run_id
        who = "" if event.run_id == self._root else f"[{event.workflow or event.run_id}] "
        kind = event.type
        if kind == "step.started":
            attempt = f" (attempt {event.attempt})" if event.attempt and event.attempt > 1 else ""
            self.current = f"{who}running {event.name}{attempt}"
            self.state = "running"
            if not self.tty:
                self.note(f"{who}▶ {event.name}{attempt}")
            else:
                self._redraw()
        elif kind == "step.completed":
            self.steps_done += 1
            took = format_duration(event.duration_ms)
            self.current = f"{who}✓ {event.name} ({took})"
            if not self.tty:
                self.note(f"{who}✓ {event.name}  {took}")
            else:
                self._redraw()
        elif kind == "step.failed":
            message = event.error.message if event.error else "failed"
            self.retries += 1
            self.note(f"{who}✗ {event.name} attempt {event.attempt or 1} failed: {message}")
        elif kind == "run.started":
            if event.run_id != self._root:
                self.note(f"{who}child run {event.run_id} started")
            else:
                self.state = "running"
                self.current = f"run {event.run_id} started"
                if not self.tty:
                    self.note(f"run {event.run_id} ({event.workflow}) started")
                else:
                    self._redraw()
        elif kind == "run.suspended":
            if event.run_id == self._root:
                self.state = "suspended"
                self.current = "waiting for a signal, timer or child run (the run is parked)"
                if not self.tty:
                    self.note("⏸ run suspended: waiting for a signal, timer or child run")
                else:
                    self._redraw()
        elif kind == "run.completed":
            if event.run_id == self._root:
                self.state = "completed"
                self.current = "run completed"
                self._redraw()
            self.note(f"{who}■ run {event.run_id} completed")
        elif kind == "run.failed":
            message = event.error.message if event.error else "failed"
            if event.run_id == self._root:
                self.state = "failed"
                self.current = message
            self.note(f"{who}■ run {event.run_id} failed: {message}")
