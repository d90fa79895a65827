"""A run's history as a versioned JSON document: what `export_history` writes and what the
testing kit's `load_history` reads back (to replay a recorded run against new code).

The document is `{"format": "durably.history", "version": 1, "run": {...},
"checkpoints": [...]}`: the run row and every checkpoint row in seq order, each in the JSON
form the models write (`WorkflowRun.to_json`, `StepCheckpoint.to_json`: camelCase keys,
payloads as the JSON values the store holds, dates in UTC). Nothing is summarised or left
out, so a replay has every recorded output, error and attempt count. Reading checks the
shape first and names the first thing that is wrong, so a hand-edited or foreign file is
refused with a reason instead of failing somewhere inside a replay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args

from durably._core.errors import RunNotFoundError
from durably._core.models import (
    RUN_STATUSES,
    CheckpointKind,
    CheckpointStatus,
    StepCheckpoint,
    WorkflowRun,
)

if TYPE_CHECKING:
    from durably._store.protocol import StateStore

__all__ = [
    "HISTORY_FORMAT",
    "HISTORY_VERSION",
    "HistoryFormatError",
    "RunHistory",
    "history_document",
    "parse_history",
    "read_history",
]

HISTORY_FORMAT = "durably.history"
HISTORY_VERSION = 1

# The keys a row cannot be rebuilt without (the others have defaults when absent).
_RUN_KEYS = ("id", "workflow", "status", "createdAt", "updatedAt")
_CHECKPOINT_KEYS = ("runId", "seq", "name", "kind", "status", "startedAt", "finishedAt")

_CHECKPOINT_STATUSES: tuple[str, ...] = get_args(CheckpointStatus)
_CHECKPOINT_KINDS: tuple[str, ...] = get_args(CheckpointKind)


class HistoryFormatError(ValueError):
    """A document that is not a durably history this version can read; the message names
    what is wrong (the format, the version, or the field)."""


@dataclass(frozen=True, slots=True)
class RunHistory:
    """A parsed history: the recorded run and its checkpoints in seq order."""

    run: WorkflowRun
    checkpoints: tuple[StepCheckpoint, ...]


def history_document(run: WorkflowRun, checkpoints: Sequence[StepCheckpoint]) -> dict[str, Any]:
    """The history document of `run` with its `checkpoints` (sorted by seq here)."""
    return {
        "format": HISTORY_FORMAT,
        "version": HISTORY_VERSION,
        "run": run.to_json(),
        "checkpoints": [cp.to_json() for cp in sorted(checkpoints, key=lambda cp: cp.seq)],
    }


async def read_history(store: StateStore, run_id: str) -> dict[str, Any]:
    """The history document of the run `run_id`; `RunNotFoundError` when it is unknown."""
    run = await store.get_run(run_id)
    if run is None:
        raise RunNotFoundError(f"run {run_id!r} not found: no history to export")
    return history_document(run, await store.list_checkpoints(run_id))


def _require(row: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    for key in keys:
        if key not in row:
            raise HistoryFormatError(f"{where} has no {key!r} field")


def parse_history(doc: object) -> RunHistory:
    """The history `doc` holds; `HistoryFormatError` naming the first thing that is wrong."""
    if not isinstance(doc, Mapping):
        raise HistoryFormatError(f"a history is a JSON object, not {type(doc).__name__}")
    fmt = doc.get("format")
    if fmt != HISTORY_FORMAT:
        raise HistoryFormatError(
            f"not a durably history: format is {fmt!r}, expected {HISTORY_FORMAT!r}"
        )
    version = doc.get("version")
    if version != HISTORY_VERSION or isinstance(version, bool):
        raise HistoryFormatError(
            f"unknown history version {version!r}: this durably reads version {HISTORY_VERSION}"
        )
    _require(doc, ("run", "checkpoints"), "the history")
    raw_run = doc["run"]
    if not isinstance(raw_run, Mapping):
        raise HistoryFormatError("the history's 'run' is not an object")
    _require(raw_run, _RUN_KEYS, "the history's run")
    if raw_run["status"] not in RUN_STATUSES:
        raise HistoryFormatError(f"the history's run has an unknown status {raw_run['status']!r}")
    try:
        run = WorkflowRun.from_json(dict(raw_run))
    except (TypeError, ValueError, KeyError) as exc:
        raise HistoryFormatError(f"the history's run cannot be read: {exc}") from None
    raw_cps = doc["checkpoints"]
    if not isinstance(raw_cps, list):
        raise HistoryFormatError("the history's 'checkpoints' is not a list")
    checkpoints: list[StepCheckpoint] = []
    for i, raw in enumerate(raw_cps):
        where = f"checkpoint {i}"
        if not isinstance(raw, Mapping):
            raise HistoryFormatError(f"{where} is not an object")
        _require(raw, _CHECKPOINT_KEYS, where)
        if raw["status"] not in _CHECKPOINT_STATUSES or raw["kind"] not in _CHECKPOINT_KINDS:
            raise HistoryFormatError(
                f"{where} has status {raw['status']!r} and kind {raw['kind']!r}: a status "
                f"is one of {', '.join(_CHECKPOINT_STATUSES)}, "
                f"a kind one of {', '.join(_CHECKPOINT_KINDS)}"
            )
        seq = raw["seq"]
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise HistoryFormatError(f"{where} has seq {seq!r}: a whole number")
        if raw["runId"] != run.id:
            raise HistoryFormatError(
                f"{where} belongs to run {raw['runId']!r}, not to the history's run {run.id!r}"
            )
        if checkpoints and seq <= checkpoints[-1].seq:
            raise HistoryFormatError(
                f"{where} has seq {seq} after seq {checkpoints[-1].seq}: "
                "checkpoints are listed once each, in seq order"
            )
        try:
            checkpoints.append(StepCheckpoint.from_json(dict(raw)))
        except (TypeError, ValueError, KeyError) as exc:
            raise HistoryFormatError(f"{where} cannot be read: {exc}") from None
    return RunHistory(run, tuple(checkpoints))
