"""ETags of the read side: a run detail's and a fan page's, so the console's polls can be
answered not-modified without reading the timeline.

- `run_detail_etag(run, stats, over)` → `W/"rd-<40 hex>"`
- `fan_page_etag(group, stats, query)` → `W/"fp-<40 hex>"`
- `etag_matches(if_none_match, etag)` — weak comparison (RFC 9110 sections 13.1.2 and 8.8.3).

The tags are SHA-256 over canonical JSON (sorted keys, no spaces, no ASCII escaping,
datetimes as `toISOString`). A stats list enters as the SORTED list of its buckets'
canonical strings, so the store's bucket order never moves a tag.

A `CheckpointStat` (one bucket of `checkpoint_stats`) is read duck-typed, so this module
does not depend on the store package: an object with snake_case attributes (`group`,
`status`, `name_kind`, `count`, `min_seq`, … `sum_attempts`) or a mapping with the
camelCase keys. Its canonical form is always the full 13-field camelCase object (absent
fields as `null`), whatever `to_json` of the store's class omits.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from durably._core.models import WorkflowRun
from durably._read.models import FanPageQuery, iso_ms
from durably._read.summarize import fan_page_bounds

__all__ = [
    "ETAG_VERSION",
    "STAT_FIELDS",
    "canonical_json",
    "canonical_stats",
    "etag_matches",
    "fan_page_etag",
    "parse_entity_tags",
    "run_detail_etag",
]

ETAG_VERSION = 1
"""The `v` input of both tags: bump it when the canonical form changes."""

# (camelCase key, snake_case attribute) of every CheckpointStat field.
STAT_FIELDS: tuple[tuple[str, str], ...] = (
    ("group", "group"),
    ("status", "status"),
    ("nameKind", "name_kind"),
    ("count", "count"),
    ("minSeq", "min_seq"),
    ("maxSeq", "max_seq"),
    ("minName", "min_name"),
    ("maxName", "max_name"),
    ("minEnqueuedAt", "min_enqueued_at"),
    ("minStartedAt", "min_started_at"),
    ("maxStartedAt", "max_started_at"),
    ("maxFinishedAt", "max_finished_at"),
    ("sumAttempts", "sum_attempts"),
)


def _default(value: object) -> Any:
    if isinstance(value, datetime):
        return iso_ms(value)
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return to_json()
    raise TypeError(f"not canonical-JSON serialisable: {type(value).__name__}")


def canonical_json(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, no ASCII escaping."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_default
    )


def _stat_field(stat: object, camel: str, snake: str) -> Any:
    if isinstance(stat, Mapping):
        return stat.get(camel, stat.get(snake))
    if hasattr(stat, snake):
        return getattr(stat, snake)
    return getattr(stat, camel, None)


def _stat_json(stat: object) -> dict[str, Any]:
    return {camel: _stat_field(stat, camel, snake) for camel, snake in STAT_FIELDS}


def _stat_group(stat: object) -> Any:
    return _stat_field(stat, "group", "group")


def canonical_stats(stats: Iterable[object]) -> list[str]:
    """The sorted canonical strings of the buckets: order-independent."""
    return sorted(canonical_json(_stat_json(b)) for b in stats)


def _run_wire(run: WorkflowRun) -> dict[str, Any]:
    # Every field as read (so any change to the run moves the tag), dates as toISOString.
    wire = run.to_json()
    wire["createdAt"] = iso_ms(run.created_at)
    wire["updatedAt"] = iso_ms(run.updated_at)
    return wire


def _tag(prefix: str, value: Any) -> str:
    digest = hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()[:40]
    return f'W/"{prefix}-{digest}"'


def run_detail_etag(run: WorkflowRun, stats: Iterable[object], over: int) -> str:
    """`W/"rd-…"` over the run row, the run's checkpoint buckets and the threshold."""
    return _tag(
        "rd",
        {"v": ETAG_VERSION, "run": _run_wire(run), "stats": canonical_stats(stats), "over": over},
    )


def fan_page_etag(
    group: str,
    stats: Iterable[object],
    query: FanPageQuery | Mapping[str, Any] | None,
) -> str:
    """`W/"fp-…"` over the group's buckets and the clamped page shape. Buckets of
    other groups in `stats` are ignored; `ifNoneMatch` is not an input, and two queries
    that clamp to the same bounds share a tag."""
    q = FanPageQuery.coerce(query)
    offset, limit = fan_page_bounds(q)
    return _tag(
        "fp",
        {
            "v": ETAG_VERSION,
            "group": group,
            "stats": canonical_stats(b for b in stats if _stat_group(b) == group),
            "offset": offset,
            "limit": limit,
            "failedOnly": bool(q.failed_only),
        },
    )


# ---------------------------------------------------------------- comparison

_OWS = " \t"


def _parse_one(text: str, i: int) -> tuple[str, int] | None:
    """One entity-tag `[W/]"<opaque>"` at `text[i]` → (opaque, end index), or None."""
    if text.startswith("W/", i):
        i += 2
    if i >= len(text) or text[i] != '"':
        return None
    end = text.find('"', i + 1)
    if end < 0:
        return None
    return text[i + 1 : end], end + 1


def parse_entity_tags(value: str) -> list[str]:
    """The opaque parts of a comma-separated `If-None-Match` list (RFC 9110 section 8.8.3), up to
    the first malformed element (elements parsed before it still count). Optional
    whitespace around commas and empty list elements (`a, , b`) are accepted, as RFC 9110
    section 5.6.1 asks of recipients. `W/` is case-sensitive."""
    tags: list[str] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and (value[i] in _OWS or value[i] == ","):
            i += 1
        if i >= n:
            break
        parsed = _parse_one(value, i)
        if parsed is None:
            break
        opaque, i = parsed
        while i < n and value[i] in _OWS:
            i += 1
        if i < n and value[i] != ",":
            break  # junk after a tag: this element is malformed
        tags.append(opaque)
    return tags


def _opaque_of(etag: str) -> str:
    text = etag.strip()
    parsed = _parse_one(text, 0)
    if parsed is not None and parsed[1] == len(text):
        return parsed[0]
    return text  # not an entity-tag: compare the string as a whole


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Weak comparison of `If-None-Match` against `etag`.

    None/blank → False; `*` → True; else True iff any listed tag's opaque part equals
    `etag`'s, the `W/` prefix ignored on either side.
    """
    if if_none_match is None:
        return False
    value = if_none_match.strip()
    if not value:
        return False
    if value == "*":
        return True
    target = _opaque_of(etag)
    return any(opaque == target for opaque in parse_entity_tags(value))
