"""Strict JSON for everything persisted: NaN/Infinity are refused (they are not JSON, and
PostgreSQL's jsonb rejects them), as SerializationError."""

from __future__ import annotations

import json
from typing import Any

from durably._core.errors import SerializationError


def dumps(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"value is not JSON-serializable: {exc}") from exc


def loads(text: str | bytes | None) -> Any:
    if text is None:
        return None
    return json.loads(text)


def compact(value: Any) -> str:
    """Compact JSON with key order as given (event tokens and event matching)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
