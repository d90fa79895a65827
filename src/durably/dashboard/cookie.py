"""The signed session cookie of the dashboard (run-detail.md §13.2): pure functions.

Value = `b64url(payload) + "." + b64url(HMAC_SHA256(secret, b64url(payload)))` (base64url
without padding); payload `{sub, name?, roles, iat, exp}` (milliseconds).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

__all__ = [
    "COOKIE_NAME",
    "DEFAULT_TTL_MS",
    "SKEW_MS",
    "clear_cookie_header",
    "is_https",
    "parse_cookie_header",
    "parse_ttl",
    "set_cookie_header",
    "sign_session",
    "verify_session",
]

COOKIE_NAME = "durable_dashboard_session"
DEFAULT_TTL_MS = 8 * 3600 * 1000
#: An expired cookie is still accepted this long after `exp` (clock skew).
SKEW_MS = 30_000
_TTL = re.compile(r"^(\d+)([smhd])$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_ttl(ttl: str | None) -> int:
    """`^\\d+[smhd]$` after trimming → milliseconds; anything else → 8 h."""
    if not isinstance(ttl, str):
        return DEFAULT_TTL_MS
    match = _TTL.match(ttl.strip())
    if match is None:
        return DEFAULT_TTL_MS
    ms = int(match.group(1)) * _UNIT_MS[match.group(2)]
    return ms if ms > 0 else DEFAULT_TTL_MS


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, body: str) -> str:
    return _b64(hmac.new(secret.encode(), body.encode("ascii"), hashlib.sha256).digest())


def sign_session(secret: str, user: Mapping[str, Any], now_ms: int, ttl_ms: int) -> str:
    payload: dict[str, Any] = {"sub": str(user["id"])}
    if isinstance(user.get("name"), str):
        payload["name"] = user["name"]
    roles = user.get("roles")
    payload["roles"] = [str(r) for r in roles] if isinstance(roles, list | tuple) else []
    payload["iat"] = now_ms
    payload["exp"] = now_ms + ttl_ms
    body = _b64(json.dumps(payload, separators=(",", ":")).encode())
    return f"{body}.{_mac(secret, body)}"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def verify_session(secret: str, value: str | None, now_ms: int) -> dict[str, Any] | None:
    """The payload of a valid, unexpired cookie value; None (never raises) otherwise."""
    if not value or "." not in value:
        return None
    body, _, sig = value.partition(".")
    if not body or not sig:
        return None
    expected = _mac(secret, body)
    if len(sig) != len(expected) or not hmac.compare_digest(sig, expected):
        return None
    try:
        payload = json.loads(_unb64(body))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("sub"), str):
        return None
    if "name" in payload and not isinstance(payload["name"], str):
        return None
    roles = payload.get("roles")
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        return None
    if not _finite(payload.get("iat")) or not _finite(payload.get("exp")):
        return None
    if now_ms > payload["exp"] + SKEW_MS:
        return None
    return payload


def parse_cookie_header(header: str | None, name: str = COOKIE_NAME) -> str | None:
    """The first `name` cookie's value: trimmed, one pair of wrapping quotes stripped,
    URL-decoded (the raw value when decoding fails)."""
    if not header:
        return None
    for part in header.split(";"):
        key, sep, value = part.partition("=")
        if not sep or key.strip() != name:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        try:
            return unquote(value, errors="strict")
        except UnicodeDecodeError:
            return value
    return None


def is_https(scheme: str, forwarded_proto: str | None) -> bool:
    if scheme.lower() == "https":
        return True
    return any(p.strip().lower() == "https" for p in (forwarded_proto or "").split(","))


def set_cookie_header(value: str, ttl_ms: int, secure: bool) -> str:
    parts = [
        f"{COOKIE_NAME}={quote(value, safe='')}",
        "Path=/",
        "HttpOnly",
        "SameSite=Lax",
        f"Max-Age={ttl_ms // 1000}",
    ]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def clear_cookie_header(secure: bool) -> str:
    parts = [
        f"{COOKIE_NAME}=",
        "Path=/",
        "HttpOnly",
        "SameSite=Lax",
        "Max-Age=0",
        "Expires=Thu, 01 Jan 1970 00:00:00 GMT",
    ]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)
