"""Human-readable rendering: tables, durations, relative times, run timelines."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from durably._cli.common import compact_json
from durably._core.models import (
    ATTEMPT_ERRORS_FIRST,
    StepCheckpoint,
    WorkflowRun,
    ms_from_utc,
    now_utc,
    utc_from_ms,
)
from durably._read.rows import RowView, describe_row, describe_rows


def format_duration(ms: float | None) -> str:
    """`<1000` → `Nms`, `<60 s` → `N.Ns`, else `N.Nm`."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{round(ms)}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    return f"{ms / 60_000:.1f}m"


def relative_time(when: datetime, now: datetime | None = None) -> str:
    """`Ns ago` < 60 s, `Nm ago` < 1 h, `Nh ago` < 1 d, else `Nd ago`."""
    seconds = max(0.0, ((now or now_utc()) - when).total_seconds())
    if seconds < 60:
        return f"{round(seconds)}s ago"
    if seconds < 3600:
        return f"{round(seconds / 60)}m ago"
    if seconds < 86_400:
        return f"{round(seconds / 3600)}h ago"
    return f"{round(seconds / 86_400)}d ago"


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = ()
) -> list[str]:
    """Columns padded to their widest cell, two-space gaps; `right` = right-aligned columns."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    return [line(headers), *(line(row) for row in rows)]


def runs_table(runs: Sequence[WorkflowRun]) -> list[str]:
    if not runs:
        return ["No runs."]
    now = now_utc()
    rows = [[r.id, r.workflow, r.status, relative_time(r.updated_at, now)] for r in runs]
    return table(["RUN", "WORKFLOW", "STATUS", "UPDATED"], rows)


def checkpoint_duration_ms(cp: StepCheckpoint) -> float:
    """finished - started, as stored (`row_duration` says what a row truly took)."""
    return max(0.0, (cp.finished_at - cp.started_at).total_seconds() * 1000)


def checkpoint_note(cp: StepCheckpoint, width: int = 60) -> str:
    """A short description of what the checkpoint recorded."""
    if cp.status == "failed" and cp.error is not None:
        return f"error: {cp.error.message}"[:width]
    if cp.kind == "sleep" and cp.wake_at is not None:
        delta = cp.wake_at - ms_from_utc(cp.started_at)
        return f"wake at +{format_duration(delta)}"
    if cp.name.startswith("signal:child:"):
        child = cp.name[len("signal:child:") :]
        if cp.status != "completed":
            return f"waiting for child run {child}"
        ok = isinstance(cp.output, dict) and cp.output.get("ok")
        return f"child run {child} {'completed' if ok else 'failed'}"
    if cp.kind == "signal":
        if cp.status != "completed":
            return "waiting"
        return "payload " + compact_json(cp.output, width - 8)
    if cp.status == "completed" and cp.output is not None:
        return "→ " + compact_json(cp.output, width - 2)
    return ""


def wall_ms() -> int:
    return ms_from_utc(now_utc())


def visible_rows(
    checkpoints: Sequence[StepCheckpoint],
    views: Mapping[int, RowView],
    *,
    engine_rows: bool = False,
) -> tuple[list[StepCheckpoint], int]:
    """The rows a timeline draws and how many engine rows it leaves out, as the console
    does: an engine row (the deadline of a wait with a timeout) folds into the row it
    belongs to (the wait shows its timeout) unless `engine_rows`; one whose owner has no row
    yet (a wait still open, or one that ended by its timeout) stays, being the only trace
    of that wait."""
    if engine_rows:
        return list(checkpoints), 0
    seqs = {cp.seq for cp in checkpoints}
    shown = []
    for cp in checkpoints:
        view = views.get(cp.seq)
        if view is not None and view.engine and view.owner is not None and view.owner in seqs:
            continue
        shown.append(cp)
    return shown, len(checkpoints) - len(shown)


def hidden_line(hidden: int, indent: str = "  ") -> list[str]:
    if not hidden:
        return []
    what = "row folded into its wait" if hidden == 1 else "rows folded into their waits"
    return [f"{indent}({hidden} engine {what}; --engine-rows shows them)"]


def timeline(
    checkpoints: Sequence[StepCheckpoint],
    *,
    indent: str = "  ",
    now_ms: int | None = None,
    engine_rows: bool = False,
) -> list[str]:
    """One row per checkpoint: seq, name, kind, status, attempts, duration, note — each
    labelled by what it stands for (`durably._read.rows`); engine rows folded into their
    owner unless `engine_rows`."""
    if not checkpoints:
        return [indent + "(no steps recorded)"]
    now = wall_ms() if now_ms is None else now_ms
    views = describe_rows(checkpoints, now)
    shown, hidden = visible_rows(checkpoints, views, engine_rows=engine_rows)
    rows = [checkpoint_row(cp, views.get(cp.seq), now_ms=now) for cp in shown]
    lines = table(TIMELINE_HEADERS, rows, right=(0, 4, 5))
    return [indent + line for line in lines] + hidden_line(hidden, indent)


TIMELINE_HEADERS = ("SEQ", "NAME", "KIND", "STATUS", "ATTEMPTS", "DURATION", "NOTE")


def row_kind(cp: StepCheckpoint, view: RowView) -> str:
    """The KIND cell: the row's true label, the worker group a remote step went to, and
    a wait's timeout."""
    text = view.label
    if cp.worker_group:
        text += f" @{cp.worker_group}"
    if view.timeout_ms is not None:
        text += f" · timeout {format_duration(view.timeout_ms)}"
    return text


def row_duration(cp: StepCheckpoint, view: RowView) -> str:
    """The DURATION cell: what the row's timestamps truly say (a sleep its length, a wait
    with a timeout how long it waited); `…` while it is under way; `—` where the store does
    not keep it (a delivered signal's row is written at delivery, not when the wait
    began)."""
    if view.duration_ms is not None:
        return format_duration(view.duration_ms)
    return "…" if cp.status in ("pending", "running") else "—"


def checkpoint_row(
    cp: StepCheckpoint, view: RowView | None = None, *, now_ms: int | None = None
) -> list[str]:
    """One timeline row: seq, name, kind, status, attempts, duration, note. `view` is the
    row read with its neighbours (`describe_rows`); without one it is read alone."""
    if view is None:
        view = describe_row(cp, wall_ms() if now_ms is None else now_ms)
    return [
        str(cp.seq),
        ("↳ " if view.engine else "") + cp.name,
        row_kind(cp, view),
        view.state.replace("_", " ") if view.state is not None else cp.status,
        str(cp.attempts),
        row_duration(cp, view),
        _note(cp, view),
    ]


def _note(cp: StepCheckpoint, view: RowView) -> str:
    if view.kind == "timeout" and view.duration_ms is not None:
        # A deadline wakes nothing by itself: it ends its wait if that is still open.
        return f"deadline +{format_duration(view.duration_ms)}"
    return checkpoint_note(cp)


def attempt_lines(checkpoints: Sequence[StepCheckpoint], *, indent: str = "  ") -> list[str]:
    """Every failed attempt of each step that had one: `#n  time  [code] message`, oldest
    first, with a line for the attempts dropped from the middle of a long history."""
    lines: list[str] = []
    for cp in checkpoints:
        errors = cp.attempt_errors or ()
        if not errors:
            continue
        failed = len(errors) + cp.attempt_errors_omitted
        lines.append(
            f"{indent}seq {cp.seq}  {cp.name}  [{cp.status}]  {cp.attempts} "
            f"attempt{'s' if cp.attempts != 1 else ''}, {failed} failed"
        )
        for i, error in enumerate(errors):
            if i == ATTEMPT_ERRORS_FIRST and cp.attempt_errors_omitted:
                lines.append(f"{indent}  … {cp.attempt_errors_omitted} more failed, not kept")
            when = utc_from_ms(error.at).strftime("%H:%M:%S.%f")[:-3]
            code = f"[{error.code}] " if error.code else ""
            lines.append(f"{indent}  #{error.attempt}  {when}  {code}{error.message}")
    return ["", "attempts:", *lines] if lines else []


def run_header(run: WorkflowRun) -> list[str]:
    """`<workflow>  [<status>]  v<version>`, the run id, then the run's facts."""
    lines = [f"{run.workflow}  [{run.status}]  v{run.workflow_version}", run.id]
    elapsed = (run.updated_at - run.created_at).total_seconds() * 1000
    facts = [
        f"created {run.created_at.isoformat(timespec='seconds')}",
        f"updated {relative_time(run.updated_at)}",
    ]
    if run.is_terminal:
        facts.append(f"took {format_duration(elapsed)}")
    if run.wake_at is not None and not run.is_terminal:
        wake = run.wake_at - ms_from_utc(now_utc())
        facts.append(
            f"wakes in {format_duration(wake)}" if wake > 0 else "wake due (a worker picks it up)"
        )
    if run.locked_by:
        facts.append(f"held by {run.locked_by}")
    if run.tags:
        facts.append("tags " + ",".join(run.tags))
    lines.append("  ".join(facts))
    return lines


def run_detail(
    run: WorkflowRun,
    checkpoints: Sequence[StepCheckpoint],
    *,
    waiting_for: Sequence[str] = (),
    children: Sequence[tuple[WorkflowRun, Sequence[StepCheckpoint]]] = (),
    render_timeline: Callable[[Sequence[StepCheckpoint]], list[str]] | None = None,
    now_ms: int | None = None,
    engine_rows: bool = False,
) -> list[str]:
    lines = [*run_header(run), "", "input:  " + compact_json(run.input, 200), ""]
    if render_timeline is None:
        lines.extend(timeline(checkpoints, now_ms=now_ms, engine_rows=engine_rows))
    else:
        lines.extend(render_timeline(checkpoints))
    lines.extend(attempt_lines(checkpoints))
    for child, child_cps in children:
        lines.append("")
        lines.append(
            f"  child {child.id}: {child.workflow}  [{child.status}]  v{child.workflow_version}"
        )
        lines.extend(timeline(child_cps, indent="    ", now_ms=now_ms, engine_rows=engine_rows))
    if waiting_for:
        lines.append("")
        for token in waiting_for:
            lines.append(f"waiting for signal {token!r}  (durably runs signal {token} --payload …)")
    if run.status == "completed":
        lines.extend(["", "output: " + compact_json(run.output, 2000)])
    if run.error is not None:
        code = f" [{run.error.code}]" if run.error.code else ""
        lines.extend(["", f"error: {run.error.message}{code}"])
    return lines
