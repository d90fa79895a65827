"""Recorded run histories: `load_history` reads the JSON document `export_history` (or
`durably runs export`) wrote, checking its shape before anything replays it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from durably._read.history import (
    HISTORY_FORMAT,
    HISTORY_VERSION,
    HistoryFormatError,
    RunHistory,
    parse_history,
)

__all__ = ["HISTORY_FORMAT", "HISTORY_VERSION", "HistoryFormatError", "RunHistory", "load_history"]


def load_history(source: str | Path | Mapping[str, Any] | RunHistory) -> RunHistory:
    """The history in `source`: a path to a JSON file, the parsed document (a dict), or an
    already loaded `RunHistory` (returned as is).

    Raises `HistoryFormatError` (a `ValueError`) naming what is wrong — not JSON, another
    format, an unknown version, a missing or malformed field; a path's message names the
    file. `FileNotFoundError` for a path that does not exist."""
    if isinstance(source, RunHistory):
        return source
    if isinstance(source, Mapping):
        return parse_history(source)
    if not isinstance(source, (str, Path)):
        raise TypeError(
            f"load_history() takes a path, a history dict or a RunHistory, not {source!r}"
        )
    path = Path(source)
    text = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HistoryFormatError(f"{path}: not JSON ({exc})") from None
    try:
        return parse_history(doc)
    except HistoryFormatError as exc:
        raise HistoryFormatError(f"{path}: {exc}") from None
