"""A progress display fed by engine events (`durably start --wait`, `durably demo`).

On a terminal it is a rich live display: one status line (elapsed time, state, steps done,
retries, what runs now) and, for a step run many times over (a fan, a loop), a bar of how
many of its runs are done, with notable moments (a failed attempt, a child run finishing)
printed as permanent lines above it. When the stream is not a terminal (CI logs, pipes) it
prints plain lines, no control codes: the first few events of each step name, then only a
line at each milestone of the count (1…10, 20, 30 … 100, 200 …), so a fan of 40,000 members
logs a few dozen lines that show the count rising, not 80,000.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from durably._cli.render import format_duration
from durably._cli.runstate import FanState
from durably._engine.defs.events import EngineEvent

# Events of one step name printed one by one (plain lines) before they are only counted.
SHOWN_PER_NAME = 3
# A step name run this many times is drawn with its own bar on a terminal.
BAR_AFTER = 5
_BARS_SHOWN = 4
REDRAW_S = 0.08


def is_milestone(n: int) -> bool:
    """1…10, then each multiple of the power of ten below `n` (20, 30 … 100, 200 … 1000)."""
    if n <= 10:
        return n >= 1
    step: int = 10 ** (len(str(n)) - 1)
    return n % step == 0


@dataclass
class StepTally:
    """What the events of one root run (and its children) have said so far."""

    root: str | None = None
    state: str = "running"
    current: str = "starting"
    steps_done: int = 0
    retries: int = 0
    started: Counter[str] = field(default_factory=Counter)
    done: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)

    def repeated(self) -> list[str]:
        """The step names run often enough to count as a fan or a loop, busiest first."""
        return [name for name, n in self.started.most_common() if n >= BAR_AFTER]

    def summary(self) -> str:
        """`120 steps done · 2 retries · leaf 118/300`."""
        parts = [f"{self.steps_done} step{'' if self.steps_done == 1 else 's'} done"]
        if self.retries:
            parts.append(f"{self.retries} retr{'y' if self.retries == 1 else 'ies'}")
        for name in self.repeated()[:_BARS_SHOWN]:
            failed = f" ({self.failed[name]} failed attempts)" if self.failed[name] else ""
            parts.append(f"{name} {self.done[name]}/{self.started[name]}{failed}")
        return " · ".join(parts)


class Progress:
    """The engine listener (`engine.subscribe(progress)`); `tick()` while waiting, `finish()`
    at the end."""

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.started = time.monotonic()
        self.tally = StepTally()
        self._live: Any = None
        self._console: Any = None
        self._drawn = 0.0
        self._fans: tuple[FanState, ...] = ()
        if self.tty:
            # Imported here: a plain run (CI, pipes) never pays for rich's live machinery.
            from rich.console import Console
            from rich.live import Live

            self._console = Console(file=self.stream, force_terminal=True, highlight=False)
            self._live = Live(
                self._renderable(),
                console=self._console,
                transient=True,
                auto_refresh=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    # ------------------------------------------------------------------ compatibility

    @property
    def steps_done(self) -> int:
        return self.tally.steps_done

    @property
    def retries(self) -> int:
        return self.tally.retries

    def set_fans(self, fans: Sequence[FanState]) -> None:
        """The root run's wide fans as the store last summarised them: on a terminal each is
        drawn with its real total instead of the bars the events alone can draw."""
        self._fans = tuple(fans)

    def follow(self, run_id: str) -> None:
        """Name the root run (else the first run that starts is taken for it)."""
        self.tally.root = run_id

    # ------------------------------------------------------------------ output

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started:.2f}s"

    def _renderable(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.spinner import Spinner
        from rich.table import Table
        from rich.text import Text

        tally = self.tally
        line = Text.assemble(
            (f"{self._elapsed():>7}  ", "dim"),
            (f"{tally.state:<9} ", _STATE_STYLE.get(tally.state, "")),
            (tally.summary(), ""),
            ("  │ ", "dim"),
            (tally.current, "italic"),
        )
        line.truncate(
            max(20, (self._console.width if self._console else 100) - 3), overflow="ellipsis"
        )
        status = Table.grid(padding=(0, 1))
        status.add_row(Spinner("dots"), line)
        rows: list[Any] = [status]
        for fan in self._fans[:_BARS_SHOWN]:
            bar = Table.grid(padding=(0, 1))
            failed = fan.counts.get("failed", 0)
            bar.add_row(
                Text(f"   fan {fan.group} {fan.label}", style="bold"),
                ProgressBar(total=max(1, fan.total), completed=fan.done, width=30),
                Text(f"{fan.done}/{fan.total} done" + (f", {failed} failed" if failed else "")),
            )
            rows.append(bar)
        fanned = {fan.label for fan in self._fans}
        for name in [n for n in tally.repeated() if n not in fanned][:_BARS_SHOWN]:
            bar = Table.grid(padding=(0, 1))
            total = max(1, tally.started[name])
            bar.add_row(
                Text(f"   {name}", style="bold"),
                ProgressBar(total=total, completed=tally.done[name], width=30),
                Text(f"{tally.done[name]}/{tally.started[name]} done"),
            )
            rows.append(bar)
        return Group(*rows)

    def _refresh(self, *, force: bool = False) -> None:
        if self._live is None:
            return
        now = time.monotonic()
        # A fan emits thousands of events a second: redraw at most every REDRAW_S.
        if force or now - self._drawn >= REDRAW_S:
            self._drawn = now
            self._live.update(self._renderable(), refresh=True)

    def note(self, message: str) -> None:
        """A permanent line (above the live display on a terminal)."""
        text = f"  {self._elapsed():>6}  {message}"
        if self._console is not None:
            from rich.text import Text

            self._console.print(Text(text))
            self._refresh(force=True)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def tick(self) -> None:
        """Refresh the spinner and elapsed time (call periodically while waiting)."""
        self._refresh(force=True)

    def finish(self) -> None:
        """Take the live display down (the terminal is left on a fresh line)."""
        if self._live is not None:
            self._refresh(force=True)
            self._live.stop()
            self._live = None

    # ------------------------------------------------------------------ events

    def __call__(self, event: EngineEvent) -> None:
        """The engine listener."""
        tally = self.tally
        if tally.root is None and event.type == "run.started":
            tally.root = event.run_id
        who = "" if event.run_id == tally.root else f"[{event.workflow or event.run_id}] "
        kind = event.type
        name = event.name or "?"
        if kind == "step.started":
            tally.started[name] += 1
            attempt = f" (attempt {event.attempt})" if event.attempt and event.attempt > 1 else ""
            tally.current = f"{who}running {name}{attempt}"
            tally.state = "running"
            if not self.tty and tally.started[name] <= SHOWN_PER_NAME:
                self.note(f"{who}▶ {name}{attempt}")
        elif kind == "step.completed":
            tally.steps_done += 1
            tally.done[name] += 1
            took = format_duration(event.duration_ms)
            tally.current = f"{who}✓ {name} ({took})"
            if not self.tty:
                if tally.done[name] <= SHOWN_PER_NAME:
                    self.note(f"{who}✓ {name}  {took}")
                elif is_milestone(tally.steps_done):
                    self.note(f"… {tally.summary()}")
        elif kind == "step.failed":
            message = event.error.message if event.error else "failed"
            tally.retries += 1
            tally.failed[name] += 1
            if self.tty or tally.failed[name] <= SHOWN_PER_NAME:
                self.note(f"{who}✗ {name} attempt {event.attempt or 1} failed: {message}")
        elif kind == "run.started":
            if event.run_id != tally.root:
                self.note(f"{who}child run {event.run_id} started")
            else:
                tally.state = "running"
                tally.current = f"run {event.run_id} started"
                if not self.tty:
                    self.note(f"run {event.run_id} ({event.workflow}) started")
        elif kind == "run.suspended":
            if event.run_id == tally.root:
                tally.state = "suspended"
                tally.current = "waiting for a signal, timer or child run (the run is parked)"
                if not self.tty:
                    self.note("⏸ run suspended: waiting for a signal, timer or child run")
        elif kind == "run.completed":
            if event.run_id == tally.root:
                tally.state = "completed"
                tally.current = "run completed"
            self.note(f"{who}■ run {event.run_id} completed · {tally.summary()}")
        elif kind == "run.failed":
            message = event.error.message if event.error else "failed"
            if event.run_id == tally.root:
                tally.state = "failed"
                tally.current = message
            self.note(f"{who}■ run {event.run_id} failed: {message}")
        self._refresh()


_STATE_STYLE = {
    "running": "cyan",
    "suspended": "yellow",
    "completed": "green",
    "failed": "bold red",
}
