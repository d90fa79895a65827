"""Fan vocabulary of the read side: fan groups, folded `fan:` rows, members.

Pure functions over `StepCheckpoint`s, shared by the in-memory reference path
(`summarize.py`) and the store-aggregate path (`store_path.py`): both must read groups,
folded rows and failures identically.
Every accessor is tolerant of malformed payloads (a folded row written by another version,
a hand-edited row): it never raises, it reads what is there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from durably._core.jsonshape import JsonObject, json_field
from durably._core.models import CHILD_EDGE_PREFIXES, JSONValue, StepCheckpoint

# ---------------------------------------------------------------- constants

FAN_SUMMARY_FAILURES = 20
"""Failed members listed per FanSummary."""

SUMMARY_CHILD_LIMIT = 200
"""Children listed by id in a summarised RunDetail."""

FAN_PAGE_DEFAULT_LIMIT = 100
"""`fan_page_bounds` limit when none (or a non-number) is given."""

FAN_PAGE_MAX_LIMIT = 1000
"""Upper clamp of a fan page's limit."""

CHILD_PREFIX = "signal:child:"
FOLDED_PREFIX = "fan:"
SPAWN_PREFIX = "spawn:"

NameKind = Literal["child", "folded", "spawn", "step"]

__all__ = [
    "CHILD_EDGE_PREFIXES",
    "CHILD_PREFIX",
    "FAN_PAGE_DEFAULT_LIMIT",
    "FAN_PAGE_MAX_LIMIT",
    "FAN_SUMMARY_FAILURES",
    "FOLDED_PREFIX",
    "SPAWN_PREFIX",
    "SUMMARY_CHILD_LIMIT",
    "FoldedFailure",
    "NameKind",
    "checkpoint_name_kind",
    "child_count",
    "child_ids_of",
    "fan_declaration",
    "folded_child_ids",
    "folded_count",
    "folded_failures",
    "is_child_edge",
    "is_failed_member",
    "weight",
]


def checkpoint_name_kind(name: str) -> NameKind:
    """What a checkpoint name denotes: `signal:child:` a child, `fan:` a folded row,
    `spawn:` a spawn, anything else a step (case-sensitive: `Fan:x` is a step). Same rule as
    `durably._core.models.checkpoint_name_kind`, typed as a Literal."""
    if name.startswith(CHILD_PREFIX):
        return "child"
    if name.startswith(FOLDED_PREFIX):
        return "folded"
    if name.startswith(SPAWN_PREFIX):
        return "spawn"
    return "step"


def is_child_edge(cp: StepCheckpoint) -> bool:
    """A row naming child runs: `signal:child:`, `fan:` or `spawn:` (CHILD_EDGE_PREFIXES)."""
    return cp.name.startswith(CHILD_EDGE_PREFIXES)


# ---------------------------------------------------------------- groups


def _ascii_digits(text: str) -> bool:
    # ASCII digits only: str.isdigit alone accepts '²', '٣', ….
    return text.isascii() and text.isdigit()


def fan_declaration(group: str) -> tuple[int | None, bool]:
    """(declared total, fail-fast) carried by a fan group.

    `all:<firstSeq>` → `(None, False)`; `all:<firstSeq>:<total>` → `(total, False)`;
    `all:<firstSeq>:<total>:ff` → `(total, True)`; `all:<firstSeq>:ff` → `(None, True)`;
    `gather:<seq>` and anything else → `(None, False)`.

    Decision: it does not check the `all` head (a 3-part group with two numeric tails
    declares its last number, whatever its head). Both read paths share this function, so
    they agree on every string.
    """
    parts = group.split(":")
    fail_fast = len(parts) >= 3 and parts[-1] == "ff"
    if fail_fast:
        parts = parts[:-1]
    total: int | None = None
    if len(parts) == 3 and _ascii_digits(parts[1]) and _ascii_digits(parts[2]):
        total = int(parts[2])
    return total, fail_fast


# ---------------------------------------------------------------- folded rows


def _non_negative_int(value: object) -> int | None:
    # JSON ints only: bools are not numbers here, and a float count is malformed.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _folded_output(cp: StepCheckpoint) -> Mapping[str, Any] | None:
    if not cp.name.startswith(FOLDED_PREFIX):
        return None
    return cp.output if isinstance(cp.output, Mapping) else {}


def folded_count(cp: StepCheckpoint) -> int | None:
    """The member count of a `fan:` row (0 when its output
    is malformed); `None` for every other checkpoint."""
    out = _folded_output(cp)
    if out is None:
        return None
    count = _non_negative_int(out.get("count"))
    return 0 if count is None else count


def _folded_first(out: Mapping[str, Any]) -> int:
    # `first` defaults to 0 when missing/invalid (negative counts as invalid).
    first = _non_negative_int(out.get("first"))
    return 0 if first is None else first


def _folded_prefix(cp: StepCheckpoint) -> str:
    return cp.name[len(FOLDED_PREFIX) :]


def folded_child_ids(cp: StepCheckpoint) -> list[str]:
    """The child ids a `fan:<P>` row stands for: `<P>.<i>` for `i` in
    `first .. first+count-1`. `[]` for any other row."""
    out = _folded_output(cp)
    if out is None:
        return []
    count = folded_count(cp) or 0
    first = _folded_first(out)
    prefix = _folded_prefix(cp)
    return [f"{prefix}.{i}" for i in range(first, first + count)]


@dataclass(frozen=True, slots=True)
class FoldedFailure(JsonObject):
    """One failed member inside a folded row: `{id, error, code?, details?}`.

    `error` is whatever the Completion carried (a string when the engine wrote it); the key
    is always written, as `null` when it carried none."""

    id: str
    error: JSONValue = field(default=None, metadata=json_field(write="always"))
    code: JSONValue = None
    details: JSONValue = None


def folded_failures(cp: StepCheckpoint) -> list[FoldedFailure]:
    """Every Completion of a `fan:` row whose `ok` is `False`, in member order, with id
    `<P>.<first+j>`. Completions beyond `count` are read as given; a non-list
    `completions` or non-object entries contribute nothing. `[]` for other rows."""
    out = _folded_output(cp)
    if out is None:
        return []
    completions = out.get("completions")
    if not isinstance(completions, list):
        return []
    first = _folded_first(out)
    prefix = _folded_prefix(cp)
    failures: list[FoldedFailure] = []
    for j, completion in enumerate(completions):
        if isinstance(completion, Mapping) and completion.get("ok") is False:
            failures.append(
                FoldedFailure(
                    id=f"{prefix}.{first + j}",
                    error=completion.get("error"),
                    code=completion.get("code"),
                    details=completion.get("details"),
                )
            )
    return failures


# ---------------------------------------------------------------- members


def weight(cp: StepCheckpoint) -> int:
    """Members a row stands for: its folded count for a `fan:` row, else 1."""
    count = folded_count(cp)
    return 1 if count is None else count


def _child_failed(cp: StepCheckpoint) -> bool:
    # A completed `signal:child:` row holds a Completion; `ok: false` marks a failed child.
    return (
        cp.status == "completed" and isinstance(cp.output, Mapping) and cp.output.get("ok") is False
    )


def is_failed_member(cp: StepCheckpoint) -> bool:
    """A `failed` row; a completed child row whose
    Completion is `ok: false`; a folded row with at least one failed
    Completion."""
    if cp.status == "failed":
        return True
    kind = checkpoint_name_kind(cp.name)
    if kind == "child":
        return _child_failed(cp)
    if kind == "folded":
        return bool(folded_failures(cp))
    return False


def child_ids_of(checkpoints: Iterable[StepCheckpoint]) -> list[str]:
    """The child ids named by the rows, in the given order,
    first occurrence kept. `signal:child:<id>` → id; `fan:` → its folded ids; `spawn:` →
    its output when a string; every other row is skipped."""
    seen: dict[str, None] = {}
    for cp in checkpoints:
        kind = checkpoint_name_kind(cp.name)
        if kind == "child":
            seen.setdefault(cp.name[len(CHILD_PREFIX) :], None)
        elif kind == "folded":
            for child_id in folded_child_ids(cp):
                seen.setdefault(child_id, None)
        elif kind == "spawn" and isinstance(cp.output, str):
            seen.setdefault(cp.output, None)
    return list(seen)


def child_count(checkpoints: Iterable[StepCheckpoint]) -> int:
    """Σ weight over child-edge rows, NOT deduplicated: each `spawn:` and
    `signal:child:` row counts one, each folded row its folded count — what the store path
    computes from aggregates alone."""
    return sum(weight(cp) for cp in checkpoints if is_child_edge(cp))
