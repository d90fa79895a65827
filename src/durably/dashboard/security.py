"""The console's front door: what every request must pass before a route sees it, and the
headers every answer carries.

The console changes runs (cancel, retry, signals), so a page on another site must not be
able to make a logged-in operator's browser do it, and a hostile DNS name pointed at a
loopback console must not reach it. `ConsoleGate` wraps the whole app and checks, in order:

1. `Host` is one of the configured names (default: the loopback names). A DNS-rebinding
   page reaches a local console under ITS name, so that name is refused → 400.
2. A mutation (every method but GET/HEAD) comes from the console itself: a browser sends
   `Origin` on every such request and `Sec-Fetch-Site` on modern engines; an `Origin` of
   another scheme/host/port or a `Sec-Fetch-Site` other than `same-origin`/`none` → 403.
   A request with neither header comes from a script or a server (curl, a webhook sender):
   no browser is involved, so no one's cookies are borrowed.
3. A mutation that carries a body, or names a content type, names `application/json`
   → else 415. An HTML form or a `no-cors` fetch can only send the three "simple" types
   without a CORS preflight, which the console never answers.
4. A request body is at most `max_body_bytes`: a larger `Content-Length` → 413 before a
   byte is read, and a body streamed without one is counted and cut off → 413. At most
   the limit is ever held in memory.

Every answer — routes, errors, the gate's own refusals — carries a Content-Security-Policy
that allows only the console's own assets (no inline code, no framing), `X-Frame-Options:
DENY`, `X-Content-Type-Options: nosniff` and `Referrer-Policy: same-origin`. A header the
app already set (a host guard's or `unauthenticated_page`'s own Response) is left as is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durably.dashboard.config import DashboardConfigError
from durably.dashboard.cookie import is_https
from durably.dashboard.responses import error_response

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "DEFAULT_MAX_BODY_BYTES",
    "LOOPBACK_HOSTS",
    "SECURITY_HEADERS",
    "ConsoleGate",
    "HostPolicy",
    "cross_site_refusal",
]

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
#: The names a console on this machine is reached by when nothing else is configured.
LOOPBACK_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "[::1]")
#: `'self'` only: the console is static ES modules and one stylesheet; its config is a
#: non-executed JSON block, so no inline script or style is needed anywhere.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)
_SAFE_METHODS = frozenset({"GET", "HEAD"})
_SAME_SITE = frozenset({"same-origin", "none"})  # `none`: typed in the address bar
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::([0-9]{1,5}))?")


@dataclass(frozen=True)
class _Host:
    name: str  # lower case, no trailing dot, IPv6 without brackets
    port: int | None


def parse_host(value: str | None) -> _Host | None:
    """A `Host` header (or an allowed-host entry) → name and port; None if malformed."""
    if value is None:
        return None
    match = _HOST.fullmatch(value.strip())
    if match is None:
        return None
    name = match.group(1).lower()
    name = name[1:-1] if name.startswith("[") else name.rstrip(".")
    port = int(match.group(2)) if match.group(2) else None
    if not name or (port is not None and not 0 < port < 65536):
        return None
    return _Host(name, port)


class HostPolicy:
    """Which `Host` headers the console answers.

    Entries: a name (`ops.example.com`, `127.0.0.1`, `[::1]`: any port), a name with a port
    (only that port), `.example.com` (the domain and every subdomain), or `*` (any host:
    for a host app that validates `Host` itself)."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.any = False
        self.exact: set[tuple[str, int | None]] = set()
        self.domains: list[str] = []
        listed: list[str] = []
        for entry in entries:
            if not isinstance(entry, str):
                raise DashboardConfigError(f"allowed_hosts entries must be strings: {entry!r}")
            text = entry.strip().lower()
            listed.append(text)
            if text == "*":
                self.any = True
            elif text.startswith(".") and parse_host(text[1:]) is not None:
                self.domains.append(text[1:].rstrip("."))
            elif (host := parse_host(text)) is not None:
                self.exact.add((host.name, host.port))
            else:
                raise DashboardConfigError(
                    f"allowed_hosts entry {entry!r} is not a host name, a host:port, a .domain or *"
                )
        if not listed:
            raise DashboardConfigError(
                "allowed_hosts is empty: the console would answer no request (pass ['*'] "
                "to accept any Host header)"
            )
        self.listed = tuple(listed)

    def allows(self, header: str | None) -> bool:
        if self.any:
            return True
        host = parse_host(header)
        if host is None:
            return False
        if (host.name, None) in self.exact or (host.name, host.port) in self.exact:
            return True
        return any(host.name == d or host.name.endswith("." + d) for d in self.domains)


def _default_port(https: bool) -> int:
    return 443 if https else 80


def _same_origin(origin: str, host_header: str | None, https: bool) -> bool:
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False  # includes the opaque origin "null" (sandboxed frames, file:)
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        return False
    try:
        origin_port = parts.port or _default_port(parts.scheme == "https")
    except ValueError:
        return False
    host = parse_host(host_header)
    if host is None:
        return False
    # Scheme is compared through the port: behind a TLS proxy the request arrives over http
    # and only `X-Forwarded-Proto` (which a browser cannot set cross-site without a
    # preflight) says the page was https.
    return (parts.hostname.rstrip("."), origin_port) == (
        host.name,
        host.port or _default_port(https),
    )


def cross_site_refusal(headers: Headers, scheme: str) -> str | None:
    """Why a state-changing request is not from the console's own pages, or None."""
    site = headers.get("sec-fetch-site")
    if site is not None and site.strip().lower() not in _SAME_SITE:
        return (
            f"Cross-site request refused (Sec-Fetch-Site: {site}): the console accepts "
            "changes only from its own pages."
        )
    origin = headers.get("origin")
    if origin is None:
        return None
    https = is_https(scheme, headers.get("x-forwarded-proto"))
    if not _same_origin(origin, headers.get("host"), https):
        return (
            f"Cross-origin request refused (Origin: {origin}): the console accepts changes "
            "only from its own pages."
        )
    return None


def _declared_length(headers: Headers) -> int | None:
    """The `Content-Length`, None when absent; ValueError when not a number."""
    text = headers.get("content-length")
    if text is None:
        return None
    if not text.strip().isascii() or not text.strip().isdigit():
        raise ValueError(text)
    return int(text)


def _content_type_refusal(headers: Headers, length: int | None) -> str | None:
    content_type = headers.get("content-type")
    has_body = bool(length) or "transfer-encoding" in headers
    if content_type is None and not has_body:
        return None  # a bodiless POST from a script (cancel, retry): nothing to parse
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == "application/json":
        return None
    return (
        f"The console takes JSON: send Content-Type: application/json "
        f"(got {content_type or 'no content type'})."
    )


def _too_large(limit: int) -> str:
    return f"The request body is larger than the console accepts ({limit} bytes)."


class ConsoleGate:
    """The ASGI wrapper that applies the checks above (see the module docstring)."""

    def __init__(self, app: ASGIApp, hosts: HostPolicy, max_body_bytes: int) -> None:
        self.app = app
        self.hosts = hosts
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_security_headers(send)
        headers = Headers(scope=scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, message = refusal
            await error_response(status, message)(scope, receive, send)
            return
        length = _declared_length(headers)  # checked by _refusal
        if length or "transfer-encoding" in headers:
            body = await _read_bounded(receive, self.max_body_bytes)
            if body is None:
                await error_response(413, _too_large(self.max_body_bytes))(scope, receive, send)
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: Headers) -> tuple[int, str] | None:
        host = headers.get("host")
        if not self.hosts.allows(host):
            return 400, (
                f"Host {host!r} is not served by this console (allowed: "
                f"{', '.join(self.hosts.listed)}). Add the name the console is reached by "
                "to allowed_hosts (create_app) or --allowed-host (durably dashboard)."
            )
        try:
            length = _declared_length(headers)
        except ValueError:
            return 400, "Content-Length is not a number."
        if scope["method"] not in _SAFE_METHODS:
            problem = cross_site_refusal(headers, scope.get("scheme", "http"))
            if problem is not None:
                return 403, problem
            problem = _content_type_refusal(headers, length)
            if problem is not None:
                return 415, problem
        if length is not None and length > self.max_body_bytes:
            return 413, _too_large(self.max_body_bytes)
        return None


async def _read_bounded(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it exceeds `limit` (the rest is never read)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away: the app sees an empty body
        chunk: bytes = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The buffered body as one message, then the real channel (disconnect notices)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed


def _with_security_headers(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers: list[Any] = list(message.get("headers", ()))
            present = {bytes(name).lower() for name, _ in headers}
            headers += [(k, v) for k, v in SECURITY_HEADERS if k not in present]
            message = {**message, "headers": headers}
        await send(message)

    return sending


def host_policy(allowed_hosts: Sequence[str] | None) -> HostPolicy:
    """`allowed_hosts` of `create_app` → a policy (default: the loopback names)."""
    if isinstance(allowed_hosts, str):
        raise DashboardConfigError(
            f"allowed_hosts must be a list of host names, not the string {allowed_hosts!r}"
        )
    return HostPolicy(LOOPBACK_HOSTS if allowed_hosts is None else allowed_hosts)
