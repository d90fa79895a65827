"""JSON answers and the `{statusCode, message, error}` error shape of every 4xx/5xx."""

from __future__ import annotations

import json
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from starlette.responses import Response

__all__ = ["error_response", "json_response", "not_modified"]


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode()


def json_response(
    value: Any, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        _dumps(value), status_code=status_code, headers=headers, media_type="application/json"
    )


def error_response(
    status_code: int, message: str, extra: Mapping[str, Any] | None = None
) -> Response:
    """`{statusCode, message, error}`, plus `extra` fields (e.g. validation `details`)."""
    try:
        phrase = HTTPStatus(status_code).phrase
    except ValueError:
        phrase = "Error"
    body: dict[str, Any] = {"statusCode": status_code, "message": message, "error": phrase}
    body.update(extra or {})
    return json_response(body, status_code)


def not_modified(etag: str) -> Response:
    """`304` with the `ETag` header and no body: the answer to a `notModified` read."""
    return Response(status_code=304, headers={"ETag": etag})
