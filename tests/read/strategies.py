"""Hypothesis strategies: realistic checkpoint timelines of ONE run.

`timelines()` draws a run body as a sequence of blocks, each claiming seqs the way the
engine does (one seq per primitive, N contiguous seqs per fan):

- ungrouped steps (remote/local; completed, failed, pending, running), sleeps, signals;
- `spawn:<id>` rows (`ctx.start_child`), sometimes joined later by an ungrouped
  `signal:child:<id>` (`ctx.child` on the same id), sometimes with a duplicate id;
- ungrouped `signal:child:` rows (`ctx.child`): running placeholder or a Completion;
- child fans (`ctx.all`/`all_settled` over a workflow): group `all:<first>` in every
  spelling (legacy, declared, `:ff`), optional `concurrency` waves with member ids
  `<run>.all.<first>[.w<k>].<i>`; every launched wave before the last is settled, the
  last may be in flight; a fail-fast fan launches no wave after one with a failure;
  settled waves may be folded into one `fan:<prefix>` row at the wave's first seq
  (`{first, count, completions}`; the other seqs of the wave hold no row);
- step fans (`ctx.all` over a step, and polyglot `gather:<seq>` groups): remote rows with
  the fan group, waves as above, pending/completed/failed members, attempts 1–3, rarely
  mixed step names;
- saga undo rows at negative seqs.

Every wave-launched member has a row, seqs are unique, and the result is in seq order
(what `list_checkpoints` returns). This drives the property tests of the in-memory path
and the store-vs-memory equivalence (tests/read/test_store_path.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from durably import StepCheckpoint
from durably._core.models import CheckpointKind, CheckpointStatus
from durably._read.models import FanPageQuery

RUN_ID = "r"
T0 = datetime(2026, 6, 11, tzinfo=UTC)
STEP_NAMES = ("charge", "resize", "notify")
ERROR_CODES = (None, "declined", "timeout")

__all__ = [
    "RUN_ID",
    "fan_page_queries",
    "groups_of",
    "overs",
    "timelines",
]


@dataclass
class _Run:
    """Mutable builder: the next seq, a clock in ms, the rows written so far."""

    run_id: str
    seq: int = 0
    clock_ms: int = 0
    rows: list[StepCheckpoint] = field(default_factory=list)

    def claim(self, n: int = 1) -> int:
        first = self.seq
        self.seq += n
        return first

    def add(
        self,
        draw: Any,
        seq: int,
        name: str,
        kind: CheckpointKind,
        status: CheckpointStatus,
        *,
        output: Any = None,
        group: str | None = None,
        attempts: int = 1,
    ) -> None:
        # Small jitter so timestamps tie sometimes and order differs from seq order.
        self.clock_ms += draw(st.integers(0, 3)) * 250
        started = T0 + timedelta(milliseconds=self.clock_ms)
        enqueued = None if draw(st.booleans()) else started - timedelta(milliseconds=500)
        settled = status in ("completed", "failed")
        finished = started + timedelta(milliseconds=draw(st.integers(0, 4)) * 100 if settled else 0)
        self.rows.append(
            StepCheckpoint(
                run_id=self.run_id,
                seq=seq,
                name=name,
                kind=kind,
                step_id=f"{self.run_id}:{seq}",
                status=status,
                started_at=started,
                finished_at=finished,
                attempts=attempts,
                output=output,
                parallel_group=group,
                enqueued_at=enqueued,
            )
        )


def _completion(draw: Any, i: int, failure_rate: int) -> dict[str, Any]:
    """A child Completion: `{ok: true, value}` or `{ok: false, error,
    code?, details?}`; failures drawn with probability ~1/failure_rate."""
    if draw(st.integers(0, failure_rate - 1)) != 0:
        return {"ok": True, "value": i}
    out: dict[str, Any] = {"ok": False, "error": f"child {i} failed"}
    code = draw(st.sampled_from(ERROR_CODES))
    if code is not None:
        out["code"] = code
        if draw(st.booleans()):
            out["details"] = {"i": i}
    return out


def _waves(n: int, concurrency: int | None) -> list[range]:
    # Launch windows: all members at once, or waves of `concurrency`.
    if concurrency is None or concurrency >= n:
        return [range(n)]
    return [range(k, min(n, k + concurrency)) for k in range(0, n, concurrency)]


def _group(draw: Any, first: int, n: int, fail_fast: bool) -> str:
    # Every group spelling; readers MUST accept the legacy one.
    declared = draw(st.integers(0, 3)) != 0
    if declared:
        return f"all:{first}:{n}" + (":ff" if fail_fast else "")
    return f"all:{first}" + (":ff" if fail_fast else "")


def _fan_shape(draw: Any, max_fan: int) -> tuple[int, int | None, list[range], int]:
    n = draw(st.integers(1, max_fan))
    concurrency = draw(st.one_of(st.none(), st.integers(1, n)))
    waves = _waves(n, concurrency)
    launched = draw(st.integers(1, len(waves)))
    return n, concurrency, waves, launched


def _child_fan(draw: Any, run: _Run, max_fan: int) -> None:
    n, concurrency, waves, launched = _fan_shape(draw, max_fan)
    first = run.claim(n)
    fail_fast = draw(st.integers(0, 2)) == 0
    group = _group(draw, first, n, fail_fast)
    failure_rate = draw(st.sampled_from((2, 5, 1000)))
    fold_rate = draw(st.sampled_from((0, 1, 2)))  # 0: never fold; 1: always; 2: sometimes
    base = f"{run.run_id}.all.{first}"
    for k, wave in enumerate(waves[:launched]):
        last = k == launched - 1
        prefix = base if concurrency is None else f"{base}.w{k}"
        # None = still running (only in the last launched wave)
        outcomes: list[dict[str, Any] | None] = []
        for i in wave:
            if last and draw(st.integers(0, 2)) == 0:
                outcomes.append(None)
            else:
                outcomes.append(_completion(draw, i, failure_rate))
        settled = all(o is not None for o in outcomes)
        fold = settled and (fold_rate == 1 or (fold_rate == 2 and draw(st.booleans())))
        if fold:
            completions = [o for o in outcomes if o is not None]
            run.add(
                draw,
                first + wave.start,
                f"fan:{prefix}",
                "signal",
                "completed",
                output={"first": wave.start, "count": len(wave), "completions": completions},
                group=group,
            )
        else:
            for i, outcome in zip(wave, outcomes, strict=True):
                name = f"signal:child:{prefix}.{i}"
                if outcome is None:
                    run.add(draw, first + i, name, "signal", "running", group=group)
                else:
                    run.add(
                        draw, first + i, name, "signal", "completed", output=outcome, group=group
                    )
        failed = any(o is not None and o.get("ok") is False for o in outcomes)
        if fail_fast and failed:
            break  # a fail-fast fan starts no further wave


def _step_fan(draw: Any, run: _Run, max_fan: int) -> None:
    n, _concurrency, waves, launched = _fan_shape(draw, max_fan)
    first = run.claim(n)
    gather = draw(st.integers(0, 5)) == 0
    fail_fast = not gather and draw(st.integers(0, 2)) == 0
    group = f"gather:{first}" if gather else _group(draw, first, n, fail_fast)
    name = draw(st.sampled_from(STEP_NAMES))
    mixed = draw(st.integers(0, 3)) == 0
    failure_rate = draw(st.sampled_from((2, 5, 1000)))
    for k, wave in enumerate(waves[:launched]):
        last = k == launched - 1
        failed = False
        for i in wave:
            if last and draw(st.integers(0, 2)) == 0:
                status: CheckpointStatus = "pending"
            elif draw(st.integers(0, failure_rate - 1)) == 0:
                status = "failed"
                failed = True
            else:
                status = "completed"
            member_name = draw(st.sampled_from(STEP_NAMES)) if mixed else name
            run.add(
                draw,
                first + i,
                member_name,
                "remote",
                status,
                output={"i": i} if status == "completed" else None,
                group=group,
                attempts=draw(st.integers(1, 3)),
            )
        if fail_fast and failed:
            break


def _spawn(draw: Any, run: _Run) -> None:
    seq = run.claim()
    child_id = draw(st.sampled_from((f"{run.run_id}.child.{seq}", "x", "y")))
    output = None if draw(st.integers(0, 9)) == 0 else child_id
    run.add(draw, seq, f"spawn:{child_id}", "local", "completed", output=output)
    if draw(st.booleans()):  # ctx.child(…, same id) joins it later
        _child(draw, run, child_id)


def _child(draw: Any, run: _Run, child_id: str | None = None) -> None:
    seq = run.claim()
    child_id = child_id or f"{run.run_id}.child.{seq}"
    name = f"signal:child:{child_id}"
    if draw(st.booleans()):
        run.add(draw, seq, name, "signal", "running")
    else:
        run.add(draw, seq, name, "signal", "completed", output=_completion(draw, seq, 3))


def _plain(draw: Any, run: _Run) -> None:
    seq = run.claim()
    choice = draw(st.integers(0, 5))
    if choice == 0:
        run.add(draw, seq, "sleep", "sleep", "completed")
    elif choice == 1:
        run.add(draw, seq, "signal:approve", "signal", "completed", output={"ok": True})
    elif choice == 2:
        status = draw(st.sampled_from(("completed", "failed", "running")))
        run.add(draw, seq, draw(st.sampled_from(STEP_NAMES)), "local", status)
    else:
        status = draw(st.sampled_from(("completed", "completed", "failed", "pending")))
        run.add(
            draw,
            seq,
            draw(st.sampled_from(STEP_NAMES)),
            "remote",
            status,
            attempts=draw(st.integers(1, 3)),
        )


@st.composite
def timelines(
    draw: Any, *, max_blocks: int = 8, max_fan: int = 40, run_id: str = RUN_ID
) -> list[StepCheckpoint]:
    """One run's checkpoints in seq order (see the module docstring)."""
    run = _Run(run_id)
    for _ in range(draw(st.integers(0, max_blocks))):
        block = draw(st.sampled_from(("plain", "spawn", "child", "child_fan", "step_fan")))
        if block == "plain":
            _plain(draw, run)
        elif block == "spawn":
            _spawn(draw, run)
        elif block == "child":
            _child(draw, run)
        elif block == "child_fan":
            _child_fan(draw, run, max_fan)
        else:
            _step_fan(draw, run, max_fan)
    for k in range(draw(st.integers(0, 2))):  # saga undo rows (negative seqs)
        run.add(draw, -1 - k, f"compensate:{STEP_NAMES[k]}", "local", "completed")
    return sorted(run.rows, key=lambda cp: cp.seq)


def groups_of(rows: list[StepCheckpoint]) -> list[str]:
    """The distinct `parallelGroup`s of a timeline, in first-seen order."""
    return list(dict.fromkeys(cp.parallel_group for cp in rows if cp.parallel_group is not None))


def overs() -> st.SearchStrategy[int]:
    """Summarisation thresholds (an integer ≥ 0), biased to small values."""
    return st.one_of(st.integers(0, 5), st.integers(0, 60))


_BOUND = st.one_of(
    st.none(),
    st.integers(-5, 60),
    st.integers(10**6, 10**9),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(("abc", "5", True, False, math.nan)),
)


@st.composite
def fan_page_queries(draw: Any) -> FanPageQuery:
    """Every fan page query shape, untyped offset/limit values included."""
    return FanPageQuery(
        offset=draw(_BOUND),
        limit=draw(_BOUND),
        failed_only=draw(st.booleans()),
        if_none_match=draw(st.sampled_from((None, "*", 'W/"fp-x"'))),
    )
