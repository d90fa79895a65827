"""The signed session cookie of the dashboard: pure functions.

Value = `b64url(payload) + "." + b64url(HMAC_SHA256(secret, b64url(payload)))` (base64url
without padding); payload `{sub, name?, roles, iat, exp}` (milliseconds).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

from durably._core.durations import Duration, to_ms

__all__ = [
    "COOKIE_NAME",
    "DEFAULT_TTL_MS",
    "MIN_SECRET_BYTES",
    "SKEW_MS",
    "clear_cookie_header",
    "is_https",
    "parse_cookie_header",
    "parse_ttl",
    "secret_problem",
    "set_cookie_header",
    "sign_session",
    "verify_session",
]

COOKIE_NAME = "durable_dashboard_session"
DEFAULT_TTL_MS = 8 * 3600 * 1000
#: An expired cookie is still accepted this long after `exp` (clock skew).
SKEW_MS = 30_000
#: The cookie's `Max-Age` is whole seconds: a shorter session would expire as it is issued.
MIN_TTL_MS = 1000
#: The shortest session-signing secret accepted, as for tenant token secrets: a short one can
#: be guessed offline from a single cookie (its MAC is public), and then anyone can forge a
#: session for any user.
MIN_SECRET_BYTES = 16


def secret_problem(secret: object) -> str | None:
    """What is wrong with a session-signing secret (None: nothing)."""
    if not isinstance(secret, str) or not secret:
        return "it must be a non-empty string"
    size = len(secret.encode("utf-8", "surrogatepass"))
    if size < MIN_SECRET_BYTES:
        return f"it is {size} bytes long; use at least {MIN_SECRET_BYTES} (random) bytes"
    return None


def parse_ttl(ttl: Duration) -> int:
    """A session lifetime → milliseconds, read like every duration of the Python API
    ("30m", "30min", "8h", "1 day", a number of seconds, a timedelta). Anything else, or less
    than a second, raises ValueError: an unreadable ttl once silently became 8 h, which
    is not what someone who wrote "30min" meant."""
    try:
        ms = to_ms(ttl)
    except (TypeError, ValueError):
        raise ValueError(
            f"session ttl {ttl!r} is not a duration (e.g. '30m', '8h', '1d')"
        ) from None
    if ms < MIN_TTL_MS:
        raise ValueError(f"session ttl {ttl!r} is shorter than one second")
    return ms


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
    # A signed value is base64url only: anything else (a percent-decoded `%C3%A9`) was never
    # issued here, and must be a denial rather than an encoding error in the MAC check.
    if not (body.isascii() and sig.isascii()):
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
        # Strict: the browser never sends the session with a request another site started
        # (not even a top-level link), so no other page can act with it. The price: following
        # a link to the console from elsewhere asks for a login once.
        "SameSite=Strict",
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
        "SameSite=Strict",
        "Max-Age=0",
        "Expires=Thu, 01 Jan 1970 00:00:00 GMT",
    ]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)
