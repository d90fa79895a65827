"""Rendering of wide fans for `durably runs show`.

A fan summarised by the read side (`RunDetail.fans`) is drawn as ONE timeline row — its seq
range, label, counts by status and a progress bar — instead of one row per member; its
members are paged on request (`--fan GROUP`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from durably._cli.render import (
    TIMELINE_HEADERS,
    checkpoint_note,
    checkpoint_row,
    format_duration,
    hidden_line,
    table,
    visible_rows,
    wall_ms,
)
from durably._core.models import StepCheckpoint
from durably._read.models import FanPage, FanSummary
from durably._read.rows import describe_rows

BAR_WIDTH = 20
_BAR_ORDER = (("completed", "#"), ("failed", "x"), ("running", "~"), ("pending", "."))


def fan_bar(counts: Mapping[str, int], total: int, width: int = BAR_WIDTH) -> str:
    """`[####xx~~....      ]`: completed, failed, running, pending, then not started."""
    if total <= 0:
        return "[" + " " * width + "]"
    cells: list[str] = []
    for status, mark in _BAR_ORDER:
        cells.extend(mark * round(width * counts.get(status, 0) / total))
    bar = "".join(cells)[:width]
    return "[" + bar.ljust(width) + "]"


def fan_counts_text(fan: FanSummary) -> str:
    parts = [f"{n} {status}" for status, n in sorted(fan.counts.items()) if n]
    if fan.not_started:
        parts.append(f"{fan.not_started} not started")
    return ", ".join(parts) or "no members yet"


def fan_row(fan: FanSummary) -> list[str]:
    """One timeline row for a whole fan (same columns as `render.timeline`)."""
    total = fan.total if fan.total is not None else fan.size
    done = fan.counts.get("completed", 0) + fan.counts.get("failed", 0)
    duration = ""
    if fan.started_at is not None and fan.finished_at is not None:
        duration = format_duration((fan.finished_at - fan.started_at).total_seconds() * 1000)
    status = "failed" if fan.counts.get("failed") else ("completed" if done == total else "running")
    note = f"{fan_bar(fan.counts, total)} {done}/{total}: {fan_counts_text(fan)}"
    if fan.fail_fast:
        note += " (fail_fast)"
    return [
        f"{fan.first_seq}-{fan.last_seq}",
        f"{fan.label} ×{total}",
        "fan",
        status,
        "",
        duration,
        note,
    ]


def summarized_timeline(
    checkpoints: Sequence[StepCheckpoint],
    fans: Sequence[FanSummary],
    *,
    indent: str = "  ",
    run_id: str = "RUN",
    now_ms: int | None = None,
    engine_rows: bool = False,
) -> list[str]:
    """The run's timeline with each wide fan as one row (at its first seq), then the fans'
    ids (what `--fan` takes) and, under each fan with failures, its first failed members
    (`FanSummary.failures`). Rows are labelled by what they stand for and engine rows are
    folded into their owner unless `engine_rows` (`render.timeline`)."""
    now = wall_ms() if now_ms is None else now_ms
    views = describe_rows(checkpoints, now)
    shown, hidden = visible_rows(checkpoints, views, engine_rows=engine_rows)
    rows: list[tuple[int, list[str]]] = []
    for cp in shown:
        rows.append((cp.seq, checkpoint_row(cp, views.get(cp.seq), now_ms=now)))
    for fan in fans:
        rows.append((fan.first_seq, fan_row(fan)))
    if not rows:
        return [indent + "(no steps recorded)", *hidden_line(hidden, indent)]
    rows.sort(key=lambda item: item[0])
    lines = [indent + line for line in table(TIMELINE_HEADERS, [r for _, r in rows], right=(4, 5))]
    lines.extend(hidden_line(hidden, indent))
    lines.extend(fan_id_lines(fans, run_id, indent=indent))
    for fan in fans:
        if fan.failures:
            lines.append("")
            lines.append(f"{indent}first failures of fan {fan.group} ({fan.label}):")
            lines.extend(
                f"{indent}  seq {cp.seq}: {checkpoint_note(cp, 90)}" for cp in fan.failures
            )
            lines.append(
                f"{indent}  (page them: durably runs show {run_id} --fan {fan.group} --failed)"
            )
    return lines


def fan_id_lines(fans: Sequence[FanSummary], run_id: str, *, indent: str = "  ") -> list[str]:
    """Each summarised fan's id (the FAN of `--fan FAN`) with what it is, and the command
    that pages it: the id is otherwise only in the JSON."""
    if not fans:
        return []
    rows = [
        [
            fan.group,
            f"{fan.label}, {fan.total if fan.total is not None else fan.size} members, "
            f"seq {fan.first_seq}-{fan.last_seq}",
        ]
        for fan in fans
    ]
    lines = ["", f"{indent}fans (page one: durably runs show {run_id} --fan FAN):"]
    lines.extend(indent + "  " + line for line in table(["FAN", "WHAT"], rows))
    return lines


def fan_page_lines(group: str, page: FanPage, offset: int, now_ms: int | None = None) -> list[str]:
    """One page of a fan's members."""
    if not page.items:
        return [f"fan {group}: no members on this page (total {page.total})"]
    end = offset + len(page.items)
    lines = [f"fan {group}: members {offset + 1}–{end} of {page.total}", ""]
    now = wall_ms() if now_ms is None else now_ms
    views = describe_rows(page.items, now)
    rows = [checkpoint_row(cp, views.get(cp.seq), now_ms=now) for cp in page.items]
    lines.extend("  " + line for line in table(TIMELINE_HEADERS, rows, right=(0, 4, 5)))
    if end < page.total:
        lines.extend(["", f"next page: --fan {group} --offset {end}"])
    return lines
