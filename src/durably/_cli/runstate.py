"""What `durably runs watch` (and `start --wait` on a non-driving app) shows of a run at one
moment: its status, its steps by status and its wide fans, read from a `RunDetail`.

A snapshot compares with the previous one, so a follower prints only what changed; its
rich view (imported on use) is what a terminal shows live.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from durably._read.models import RunDetail

__all__ = ["FanState", "RunSnapshot", "StepState", "snapshot_of", "snapshot_view"]

# The latest steps a live view lists under the counts.
RECENT_STEPS = 8


@dataclass(frozen=True, slots=True)
class StepState:
    seq: int
    name: str
    status: str
    attempts: int


@dataclass(frozen=True, slots=True)
class FanState:
    group: str
    label: str
    total: int
    counts: Mapping[str, int]

    @property
    def done(self) -> int:
        return self.counts.get("completed", 0) + self.counts.get("failed", 0)

    def text(self) -> str:
        failed = self.counts.get("failed", 0)
        tail = f" ({failed} failed)" if failed else ""
        return f"fan {self.group} {self.label}: {self.done}/{self.total} done{tail}"


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    run_id: str
    workflow: str
    status: str
    steps: tuple[StepState, ...]
    fans: tuple[FanState, ...]

    def counts(self) -> Counter[str]:
        """Steps by status, the members of summarised fans included."""
        counts: Counter[str] = Counter(step.status for step in self.steps)
        for fan in self.fans:
            counts.update(fan.counts)
        return counts

    def summary(self) -> str:
        """`running · 12 steps done, 1 failed, 3 running`."""
        counts = self.counts()
        parts = [f"{counts.get('completed', 0)} steps done"]
        parts += [
            f"{n} {status}" for status, n in sorted(counts.items()) if n and status != "completed"
        ]
        return f"{self.status} · " + ", ".join(parts)

    def changed_from(self, other: RunSnapshot) -> bool:
        return (self.status, self.steps, self.fans) != (other.status, other.steps, other.fans)

    def lines_since(self, before: RunSnapshot | None) -> list[str]:
        """Plain lines for what changed since `before` (everything when None)."""
        old_steps = {s.seq: s for s in before.steps} if before is not None else {}
        old_fans = {f.group: f for f in before.fans} if before is not None else {}
        lines = []
        if before is None or before.status != self.status:
            lines.append(f"run {self.run_id} ({self.workflow}) {self.summary()}")
        for step in self.steps:
            if old_steps.get(step.seq) != step:
                attempts = f" (attempt {step.attempts})" if step.attempts > 1 else ""
                lines.append(f"  seq {step.seq} {step.name}: {step.status}{attempts}")
        for fan in self.fans:
            if old_fans.get(fan.group) != fan:
                lines.append("  " + fan.text())
        if before is not None and before.status == self.status and lines:
            lines.append(f"  · {self.summary()}")
        return lines

    def to_json(self) -> dict[str, Any]:
        counts = self.counts()
        return {
            "runId": self.run_id,
            "workflow": self.workflow,
            "status": self.status,
            "steps": dict(sorted(counts.items())),
            "fans": [
                {
                    "group": f.group,
                    "label": f.label,
                    "total": f.total,
                    "done": f.done,
                    "counts": dict(f.counts),
                }
                for f in self.fans
            ],
        }


def snapshot_of(detail: RunDetail) -> RunSnapshot:
    fans = tuple(
        FanState(
            f.group,
            f.label,
            f.total if f.total is not None else f.size,
            dict(sorted(f.counts.items())),
        )
        for f in detail.fans or ()
    )
    steps = tuple(StepState(cp.seq, cp.name, cp.status, cp.attempts) for cp in detail.timeline)
    run = detail.run
    return RunSnapshot(run.id, run.workflow, run.status, steps, fans)


def snapshot_view(snap: RunSnapshot, elapsed_s: float) -> Any:
    """The rich renderable of a snapshot: a status line, a bar per fan, the latest steps."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    style = {"completed": "green", "failed": "bold red", "dead": "bold red"}.get(
        snap.status, "cyan"
    )
    head = Text.assemble(
        (f"{elapsed_s:6.1f}s  ", "dim"),
        (f"{snap.workflow} ", "bold"),
        (f"{snap.run_id}  ", "dim"),
        (snap.summary(), style),
    )
    rows: list[Any] = [head]
    if snap.fans:
        fans = Table.grid(padding=(0, 1))
        for fan in snap.fans:
            fans.add_row(
                Text(f"  fan {fan.group} {fan.label}"),
                ProgressBar(total=max(1, fan.total), completed=fan.done, width=30),
                Text(
                    f"{fan.done}/{fan.total}"
                    + (f" · {fan.counts.get('failed')} failed" if fan.counts.get("failed") else "")
                ),
            )
        rows.append(fans)
    recent = snap.steps[-RECENT_STEPS:]
    if recent:
        table = Table(box=None, padding=(0, 2), show_edge=False, pad_edge=False)
        for header in ("SEQ", "NAME", "STATUS", "ATTEMPTS"):
            table.add_column(header, style="dim" if header == "SEQ" else None)
        for step in recent:
            table.add_row(str(step.seq), step.name, step.status, str(step.attempts))
        rows.append(table)
    return Group(*rows)
