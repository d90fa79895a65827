"""The arguments of tenant run requests, read strictly.

A tenant's arguments reach the store's filters, so each is checked for type and size before
it is used: a wrong type is refused (`GatewayMessageError`) rather than passed on, where a
store might read it in a way nobody meant. A run list or facet query is ALWAYS confined to the
asking tenant's namespace: whatever namespace the tenant names is discarded, and a list asks
for at most the configured number of runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durably._core.models import RUN_STATUSES, UNSET, AttributeFilter, RunQuery
from durably._engine.gateway.wire import GatewayMessageError, GatewaySettings
from durably._read import lists

__all__ = [
    "opt_bool",
    "opt_int",
    "opt_mapping",
    "opt_str",
    "run_id_arg",
    "run_ids_arg",
    "tenant_run_query",
]

_MAX_FILTER_VALUES = 100
_MAX_FILTER_CHARS = 256
_MAX_OFFSET = 1_000_000
_ATTRIBUTE_OPS = ("eq", "ne", "gt", "gte", "lt", "lte", "in")
_SINGULAR = {"workflow": "workflows", "status": "statuses", "tag": "tags"}


def opt_mapping(body: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise GatewayMessageError(f"{key} must be an object")
    return value


def opt_int(
    args: Mapping[str, Any], key: str, *, low: int = 0, high: int = 2**31 - 1
) -> int | None:
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise GatewayMessageError(f"{key} must be an integer from {low} to {high}")
    return value


def opt_bool(args: Mapping[str, Any], key: str) -> bool:
    value = args.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise GatewayMessageError(f"{key} must be true or false")
    return value


def opt_str(args: Mapping[str, Any], key: str, *, limit: int = 1024) -> str | None:
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise GatewayMessageError(f"{key} must be a string of at most {limit} characters")
    return value


def run_id_arg(body: Mapping[str, Any]) -> str:
    value = body.get("runId")
    if not isinstance(value, str) or not value or len(value) > 1024:
        raise GatewayMessageError("runId must be a non-empty string")
    return value


def run_ids_arg(body: Mapping[str, Any], settings: GatewaySettings) -> list[str]:
    value = body.get("runIds")
    if not isinstance(value, list) or len(value) > settings.max_run_ids:
        raise GatewayMessageError(f"runIds must be a list of at most {settings.max_run_ids} ids")
    if not all(isinstance(v, str) and v and len(v) <= 1024 for v in value):
        raise GatewayMessageError("runIds must hold non-empty strings")
    return list(dict.fromkeys(value))


def _strings(key: str, value: object) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > _MAX_FILTER_VALUES:
        raise GatewayMessageError(f"{key} must be a string or a list of at most 100 strings")
    if not all(isinstance(v, str) and len(v) <= _MAX_FILTER_CHARS for v in items):
        raise GatewayMessageError(f"{key} must hold strings of at most 256 characters")
    return tuple(items)


def _scalar(key: str, value: object) -> str | int | float | bool:
    if not isinstance(value, (str, int, float, bool)):
        raise GatewayMessageError(f"attributes: {key} must be a string, number or bool")
    return value


def _attributes(value: object) -> tuple[AttributeFilter, ...]:
    if not isinstance(value, list) or len(value) > _MAX_FILTER_VALUES:
        raise GatewayMessageError("attributes must be a list of at most 100 filters")
    out: list[AttributeFilter] = []
    for item in value:
        if not isinstance(item, dict):
            raise GatewayMessageError("each attribute filter must be an object {key, op, value}")
        key, op = item.get("key"), item.get("op")
        if not isinstance(key, str) or not key or len(key) > _MAX_FILTER_CHARS:
            raise GatewayMessageError("attributes: key must be a non-empty string")
        if op not in _ATTRIBUTE_OPS:
            raise GatewayMessageError(f"attributes: op must be one of {', '.join(_ATTRIBUTE_OPS)}")
        if op == "in":
            values = item.get("values")
            if not isinstance(values, list) or len(values) > _MAX_FILTER_VALUES:
                raise GatewayMessageError("attributes: `in` needs a list of at most 100 values")
            out.append(
                AttributeFilter(key, "in", values=tuple(_scalar("values", v) for v in values))
            )
        else:
            out.append(AttributeFilter(key, op, value=_scalar("value", item.get("value"))))
    return tuple(out)


def tenant_run_query(
    query: object, tenant: str, settings: GatewaySettings, *, paged: bool
) -> RunQuery:
    """A run query from a tenant's JSON (`workflow(s)`, `status(es)`, `tag(s)`, `origin(s)`,
    `attributes`, `limit`, `offset`), confined to `tenant`'s namespace. The query's own
    `namespace`/`namespaces` are discarded: the tenant is the namespace."""
    if query is None:
        query = {}
    if not isinstance(query, dict):
        raise GatewayMessageError("query must be an object")
    kwargs: dict[str, Any] = {}
    for single, plural in _SINGULAR.items():
        values: tuple[str, ...] = ()
        for key in (single, plural):
            if query.get(key) is not None:
                values += _strings(key, query[key])
        if values:
            kwargs[plural] = tuple(dict.fromkeys(values))
    bad = [s for s in kwargs.get("statuses", ()) if s not in RUN_STATUSES]
    if bad:
        raise GatewayMessageError(f"unknown run status {bad[0][:40]!r}")
    if "origin" in query:
        origin = query["origin"]
        if origin is not None and not (
            isinstance(origin, str) and len(origin) <= _MAX_FILTER_CHARS
        ):
            raise GatewayMessageError("origin must be a string or null")
        kwargs["origin"] = origin
    if query.get("origins") is not None:
        origins = query["origins"]
        if not isinstance(origins, list) or len(origins) > _MAX_FILTER_VALUES:
            raise GatewayMessageError("origins must be a list of at most 100 values")
        if not all(
            o is None or (isinstance(o, str) and len(o) <= _MAX_FILTER_CHARS) for o in origins
        ):
            raise GatewayMessageError("origins must hold strings or null")
        kwargs["origins"] = tuple(origins)
    if query.get("attributes") is not None:
        kwargs["attributes"] = _attributes(query["attributes"])
    if paged:
        limit = opt_int(query, "limit", low=1)
        wanted = settings.default_list_limit if limit is None else limit
        kwargs["limit"] = min(wanted, settings.max_list_limit)
        kwargs["offset"] = opt_int(query, "offset", low=0, high=_MAX_OFFSET) or 0
    origin = kwargs.pop("origin", UNSET)
    # The tenant IS the namespace: never the one the request named.
    return lists.as_run_query(**kwargs, origin=origin, namespace=tenant, namespaces=None)
