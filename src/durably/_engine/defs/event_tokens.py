"""The waiter tokens of `ctx.wait_for_event` and how an event's payload is matched against a
wait's `match` (shared by the ctx, `publish_event` and the event triggers)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from durably._core.jsonutil import compact

__all__ = ["event_matches", "event_token", "event_token_prefix", "match_of_token"]


def event_token_prefix(name: str) -> str:
    return "event:" + _b64(name) + ":"


def event_token(name: str, match: Mapping[str, Any] | None, run_id: str, seq: int) -> str:
    """The waiter token of `wait_for_event`:
    `event:<b64 name>:<b64 JSON(match or {})>:<runId>#<seq>`."""
    return f"{event_token_prefix(name)}{_b64(compact(dict(match or {})))}:{run_id}#{seq}"


def match_of_token(token: str) -> dict[str, Any]:
    parts = token.split(":")
    try:
        return dict(json.loads(base64.b64decode(parts[2]).decode("utf-8")))
    except Exception:
        return {}


def event_matches(payload: Any, match: Mapping[str, Any] | None) -> bool:
    """An event matches when every match key's compact JSON equals the payload key's."""
    if not match:
        return True
    if not isinstance(payload, dict):
        return False
    return all(k in payload and compact(payload[k]) == compact(v) for k, v in match.items())


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")
