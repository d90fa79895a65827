"""Run filters from flat query parameters (run-detail.md §12.2) and the `runs/values` field.

`run_query_kwargs(params)` turns a request's repeatable query parameters into the keyword
filters of `RunQuery` (what `Engine.list_runs(**query)` and friends take). Blank values are
dropped, a repeated parameter is a set, malformed `attr` entries and bad page numbers are
ignored (never coerced).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = [
    "ATTR_OPS",
    "VALUE_FIELDS",
    "BadRequest",
    "MultiParams",
    "coerce_attr_value",
    "non_negative_int",
    "parse_attr",
    "run_query_kwargs",
    "value_facet_request",
    "without_page",
]

ATTR_OPS = frozenset({"eq", "ne", "gt", "gte", "lt", "lte"})
#: Column/tag axes `GET runs/values?field=` accepts besides `attr.<key>`.
VALUE_FIELDS = frozenset({"workflow", "status", "origin", "namespace", "tag", "attributeKey"})
VALUE_LIMIT_DEFAULT = 100


class MultiParams(Protocol):
    """What Starlette's `QueryParams` offers (and a dict of lists in tests)."""

    def getlist(self, key: str) -> list[str]: ...


class BadRequest(Exception):
    """A 400 answer with this message."""


def _values(params: MultiParams, key: str) -> list[str]:
    out: list[str] = []
    for value in params.getlist(key):
        if value.strip() == "":
            continue
        if value not in out:
            out.append(value)
    return out


def _first(params: MultiParams, key: str) -> str | None:
    values = params.getlist(key)
    return values[0] if values else None


def non_negative_int(text: str | None) -> int | None:
    """A non-negative integer, or None for anything else (absent, blank, -1, 'abc', 1.5)."""
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit() or not text.isascii():
        return None
    return int(text)


def coerce_attr_value(text: str) -> bool | int | float | str:
    """`true`/`false` → bool, a non-empty numeric string → number, else the string."""
    if text == "true":
        return True
    if text == "false":
        return False
    if text.strip() != "":
        try:
            number = float(text)
        except ValueError:
            return text
        if not math.isfinite(number):
            return text
        if number.is_integer() and "." not in text and "e" not in text.lower():
            return int(number)
        return number
    return text


def parse_attr(entry: str) -> dict[str, Any] | None:
    """`key:op:value` (the value keeps its colons) → an attribute filter, None if malformed."""
    key, sep, rest = entry.partition(":")
    if not sep or not key:
        return None
    op, sep, value = rest.partition(":")
    if not sep or op not in ATTR_OPS:
        return None
    return {"key": key, "op": op, "value": coerce_attr_value(value)}


def _one_or_many(out: dict[str, Any], values: Sequence[Any], one: str, many: str) -> None:
    if len(values) == 1:
        out[one] = values[0]
    elif values:
        out[many] = list(values)


def run_query_kwargs(params: MultiParams) -> dict[str, Any]:
    """The `RunQuery` keywords of a request's flat filters (§12.2)."""
    out: dict[str, Any] = {}
    _one_or_many(out, _values(params, "status"), "status", "statuses")
    _one_or_many(out, _values(params, "workflow"), "workflow", "workflows")
    _one_or_many(out, _values(params, "namespace"), "namespace", "namespaces")
    _one_or_many(out, _values(params, "tag"), "tag", "tags")
    origins: list[str | None] = list(_values(params, "origin"))
    unattributed = (_first(params, "unattributed") or "").strip().lower()
    if unattributed in ("true", "1"):
        origins.append(None)
    _one_or_many(out, origins, "origin", "origins")
    attributes = [a for a in (parse_attr(e) for e in params.getlist("attr")) if a is not None]
    if attributes:
        out["attributes"] = attributes
    limit = non_negative_int(_first(params, "limit"))
    if limit is not None:
        out["limit"] = limit
    offset = non_negative_int(_first(params, "offset"))
    if offset is not None:
        out["offset"] = offset
    return out


def without_page(query: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in query.items() if k not in ("limit", "offset")}


_DROPPED_FOR_FIELD: Mapping[str, tuple[str, ...]] = {
    "workflow": ("workflow", "workflows"),
    "status": ("status", "statuses"),
    "origin": ("origin", "origins"),
    "namespace": ("namespace", "namespaces"),
    "tag": ("tag", "tags"),
    "attributeKey": ("attributes",),
}


def value_facet_request(
    params: MultiParams,
) -> tuple[dict[str, Any], dict[str, Any], int, int]:
    """`GET runs/values`: (axis, filters minus the enumerated field's predicates, limit,
    offset). Raises `BadRequest` for a missing or unknown field."""
    field = _first(params, "field") or _first(params, "groupByCount[field]")
    if field is None or field.strip() == "":
        raise BadRequest("Query parameter `field` is required.")
    limit = non_negative_int(_first(params, "limit"))
    if limit is None:
        limit = non_negative_int(_first(params, "groupByCount[limit]"))
    if not limit:
        limit = VALUE_LIMIT_DEFAULT
    offset = non_negative_int(_first(params, "offset")) or 0
    query = without_page(run_query_kwargs(params))
    if field.startswith("attr.") and len(field) > len("attr."):
        key = field[len("attr.") :]
        axis: dict[str, Any] = {"field": "attributeValue", "key": key}
        kept = [a for a in query.get("attributes", ()) if a["key"] != key]
        if kept:
            query["attributes"] = kept
        else:
            query.pop("attributes", None)
        return axis, query, limit, offset
    if field not in VALUE_FIELDS:
        raise BadRequest(
            f"Unknown field {field!r}: use one of {', '.join(sorted(VALUE_FIELDS))} or attr.<key>."
        )
    for name in _DROPPED_FOR_FIELD[field]:
        query.pop(name, None)
    return {"field": field}, query, limit, offset
