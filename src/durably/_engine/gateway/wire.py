"""What crosses the tenant gateway, read strictly: start-run messages, run requests, replies
and the optional signed tenant token.

Everything here comes from processes the control plane does not trust (a tenant may be
hostile, buggy or from another SDK version), so the readers never trust a shape: a message
that is not what it claims raises `GatewayMessageError` with a short reason and a code, and
the caller logs it with the message's ids and drops it (or answers it with the error). Sizes
are bounded (`GatewaySettings`) so one message cannot make the control plane read, store or
list without limit.

The wire is the one `durable-worker` and the TypeScript gateway speak: camelCase keys, unknown
keys ignored. The signed tenant token is durably's addition, carried in a `token` key that
other consumers ignore: `dwt1.<base64url tenant>.<expiry ms, 0 = none>.<base64url HMAC-SHA256>`.
With a secret configured, the control plane takes the tenant from a valid token, never from
the claim next to it, so a tenant cannot act as another by writing another name.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from durably._core.bounds import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    PayloadRejectedError,
    PayloadTooLargeError,
    check_json_value,
    check_size,
    check_text,
)
from durably._core.errors import InvalidRunIdError
from durably._core.ids import validate_run_id
from durably._core.jsonshape import iso_ms
from durably._transport.protocol import (
    GatewayChannel,
    TenantChannel,
)

__all__ = [
    "CROSS_TENANT",
    "CROSS_TENANT_MESSAGE",
    "RUN_ID_KINDS",
    "RUN_REQUEST_KINDS",
    "GatewayChannel",
    "GatewayMessageError",
    "GatewaySettings",
    "RunRequest",
    "StartRun",
    "TenantChannel",
    "check_tenant",
    "error_reply",
    "mint_tenant_token",
    "ok_reply",
    "parse_run_request",
    "parse_start_run",
    "read_tenant_token",
    "request_id_of",
    "secret_bytes",
    "verify_tenant_token",
    "wire_json",
]

CROSS_TENANT = "cross-tenant"
CROSS_TENANT_MESSAGE = "run belongs to another tenant"

RUN_ID_KINDS = frozenset(
    {"getRunDetail", "getFanMembers", "cancel", "retry", "continue", "retryWithInput", "redispatch"}
)
"""The verbs that act on one run: the responder loads that run first and refuses it when it
lives in another tenant's namespace."""
RUN_REQUEST_KINDS = RUN_ID_KINDS | {
    "listRuns",
    "runFacets",
    "runValueFacets",
    "workerHealth",
    "waitingFor",
}

_TOKEN_VERSION = "dwt1"
_MIN_SECRET_BYTES = 16
_MAX_TENANT_CHARS = 128
_MAX_TAGS = 64
_MAX_TAG_CHARS = 256
_MAX_ATTRIBUTES = 64
_MAX_ID_CHARS = 200

# Engine-minted tags mean something to the engine (a parent to notify, a singleton slot, a
# version it pinned); a tenant that set them could make its run look like another tenant's
# child. They are stripped from what a tenant asks for.
ENGINE_MINTED_TAG_PREFIXES = ("singleton:", "concurrency:", "version:undeclared", "durable:")

# Ids of the shapes the engine derives from a run id (children, fan members, onError
# handlers, retries, continuations). A tenant choosing one could squat a run another tenant's
# run is about to start, or — a `~retry~` id — have its completion delivered to the origin's
# parent. Tenant-chosen ids of those shapes are refused.
_DERIVED_ID = re.compile(r"~retry~|\.(?:child|all|onError)\.\d|~\d+$")


class GatewayMessageError(ValueError):
    """A gateway message that cannot be used; `code` is what the reply carries."""

    def __init__(self, message: str, code: str = "bad-request"):
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """The control plane's limits on what tenants send, and the token secret.

    - `secret`: with one (16 bytes at least), every run request must carry a valid signed
      tenant token and the tenant is taken from it; start-run messages too, unless
      `allow_unsigned_start_runs` (durable-worker's `Worker.start_run` cannot sign).
    - `max_message_bytes`: a message larger than this (as compact JSON) is refused.
    - `max_payload_bytes`: a start-run's input larger than this (as compact JSON) is refused
      (the engine's `max_payload_bytes`; an engine's gateway is given its engine's value).
    - `max_list_limit` / `default_list_limit`: a run list asks for at most this many runs
      (a larger `limit` is lowered to it) / this many when it gives none.
    - `max_run_ids`: how many ids one `waitingFor` may name.
    - `event_backlog`: engine events waiting to be republished before new ones are dropped
      (the channel is best effort, like every pub/sub).
    """

    secret: bytes | None = field(default=None, repr=False)
    allow_unsigned_start_runs: bool = False
    max_message_bytes: int = 256 * 1024
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_list_limit: int = 200
    default_list_limit: int = 50
    max_run_ids: int = 500
    event_backlog: int = 10_000

    def __post_init__(self) -> None:
        secret: object = self.secret
        if secret is not None:
            if not isinstance(secret, (bytes, str)):
                raise TypeError("GatewaySettings.secret must be bytes, a str or None")
            object.__setattr__(self, "secret", secret_bytes(secret))
        for name in (
            "max_message_bytes",
            "max_payload_bytes",
            "max_list_limit",
            "default_list_limit",
            "max_run_ids",
            "event_backlog",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GatewaySettings.{name} must be a positive int, not {value!r}")
        if self.default_list_limit > self.max_list_limit:
            raise ValueError("GatewaySettings.default_list_limit exceeds max_list_limit")


# ------------------------------------------------------------------ tenants and tokens


def check_tenant(value: object) -> str:
    """`value` when it can name a tenant: it becomes a run namespace, a queue suffix
    (`name@tenant`, where `:` is not allowed and a second `@` would change the partition) and
    a channel name, so only printable text without spaces, `:` or `@`, up to 128 characters."""
    if not isinstance(value, str) or not value:
        raise GatewayMessageError("tenant must be a non-empty string")
    if len(value) > _MAX_TENANT_CHARS:
        raise GatewayMessageError(f"tenant is longer than {_MAX_TENANT_CHARS} characters")
    if not value.isprintable() or any(ch.isspace() or ch in ":@" for ch in value):
        raise GatewayMessageError(
            f"tenant {value[:40]!r} has a space, ':', '@' or control character"
        )
    return value


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(secret: bytes, signed: str) -> str:
    return _b64(hmac.new(secret, signed.encode("ascii"), hashlib.sha256).digest())


def secret_bytes(secret: bytes | str) -> bytes:
    """The HMAC key of a configured secret (a str is taken as UTF-8); too short is refused:
    a guessable key would let anyone mint tokens."""
    key = secret.encode() if isinstance(secret, str) else secret
    if not isinstance(key, bytes) or len(key) < _MIN_SECRET_BYTES:
        raise ValueError(f"a tenant token secret must be at least {_MIN_SECRET_BYTES} bytes long")
    return key


def mint_tenant_token(
    secret: bytes | str, tenant: str, *, ttl_s: float | None = None, now_ms: int | None = None
) -> str:
    """A token proving that whoever holds `secret` let its bearer act as `tenant` (until
    `ttl_s` seconds from now; forever when None)."""
    key = secret_bytes(secret)
    check_tenant(tenant)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    expiry = 0 if ttl_s is None else now + max(1, int(ttl_s * 1000))
    signed = f"{_TOKEN_VERSION}.{_b64(tenant.encode())}.{expiry}"
    return f"{signed}.{_signature(key, signed)}"


def _token_parts(token: object) -> tuple[str, str, int, str]:
    if not isinstance(token, str) or len(token) > 1024:
        raise GatewayMessageError("tenant token is not a token", "unauthorized")
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != _TOKEN_VERSION or not parts[2].isdigit():
        raise GatewayMessageError("tenant token is not a token", "unauthorized")
    try:
        tenant = _unb64(parts[1]).decode("utf-8")
    except (binascii.Error, ValueError):
        raise GatewayMessageError("tenant token is not a token", "unauthorized") from None
    return f"{parts[0]}.{parts[1]}.{parts[2]}", tenant, int(parts[2]), parts[3]


def read_tenant_token(token: str) -> str:
    """The tenant a token names, WITHOUT checking its signature (a tenant learning its own
    name from the token it was given; the control plane verifies)."""
    return check_tenant(_token_parts(token)[1])


def verify_tenant_token(secret: bytes, token: object, *, now_ms: int) -> str:
    """The tenant of a token signed with `secret` and not expired; `GatewayMessageError`
    (code `unauthorized`) otherwise."""
    signed, tenant, expiry, signature = _token_parts(token)
    if not hmac.compare_digest(_signature(secret, signed), signature):
        raise GatewayMessageError("tenant token signature is invalid", "unauthorized")
    if expiry and now_ms > expiry:
        raise GatewayMessageError("tenant token has expired", "unauthorized")
    try:
        return check_tenant(tenant)
    except GatewayMessageError as exc:
        raise GatewayMessageError(exc.message, "unauthorized") from None


def _tenant_of(
    data: Mapping[str, Any], settings: GatewaySettings, now_ms: int, *, signed: bool
) -> str:
    """The tenant a message acts for: from its verified token when the control plane has a
    secret (the claim beside it must agree), else its claim."""
    claim = data.get("tenant")
    if settings.secret is None or not signed:
        return check_tenant(claim)
    if data.get("token") is None:
        raise GatewayMessageError("a signed tenant token is required", "unauthorized")
    tenant = verify_tenant_token(settings.secret, data.get("token"), now_ms=now_ms)
    if claim is not None and claim != tenant:
        raise GatewayMessageError("tenant does not match the tenant token", "unauthorized")
    return tenant


def _size(data: Any) -> int:
    try:
        return len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError):
        raise GatewayMessageError("message is not JSON") from None


# ------------------------------------------------------------------ start-run messages


@dataclass(frozen=True, slots=True)
class StartRun:
    """A request to start `workflow` with `input` in the tenant's namespace."""

    tenant: str
    workflow: str
    input: Any
    run_id: str | None = None
    tags: tuple[str, ...] | None = None
    search_attributes: dict[str, str | int | float | bool] | None = None
    stripped_tags: tuple[str, ...] = ()
    """Engine-minted tags the message asked for and did not get."""


def _tenant_run_id(value: object, what: str = "runId") -> str:
    try:
        run_id = validate_run_id(value, what=what)
    except InvalidRunIdError as exc:
        raise GatewayMessageError(str(exc)) from None
    return run_id


def parse_start_run(data: Mapping[str, Any], settings: GatewaySettings, *, now_ms: int) -> StartRun:
    if _size(data) > settings.max_message_bytes:
        raise GatewayMessageError(
            f"message is larger than {settings.max_message_bytes} bytes", "too-large"
        )
    tenant = _tenant_of(data, settings, now_ms, signed=not settings.allow_unsigned_start_runs)
    workflow = data.get("workflow")
    if not isinstance(workflow, str) or not workflow or len(workflow) > 255:
        raise GatewayMessageError("workflow must be a non-empty string of at most 255 characters")
    run_id: str | None = None
    if data.get("runId") is not None:
        run_id = _tenant_run_id(data.get("runId"))
        if _DERIVED_ID.search(run_id):
            raise GatewayMessageError(
                f"runId {run_id[:60]!r} has the shape of an id the engine derives "
                "(.child.<n>, .all.<n>, .onError.<n>, ~retry~, ~<n>)"
            )
    tags, stripped = _tags(data.get("tags"))
    attributes = _search_attributes(data.get("searchAttributes"))
    # Text and values a store cannot hold (a NUL in a tag, which PostgreSQL refuses; a lone
    # surrogate; a non-finite number) are refused here, once, rather than found by a store
    # write that would fail the same way on every redelivery.
    try:
        check_text("workflow", workflow)
        for tag in tags or ():
            check_text("tag", tag)
        for key, item in (attributes or {}).items():
            check_text("searchAttributes key", key)
            if isinstance(item, str):
                check_text(f"searchAttributes[{key[:40]!r}]", item)
            else:
                check_json_value(f"searchAttributes[{key[:40]!r}]", item)
        check_json_value("input", data.get("input"))
        check_size("input", _size(data.get("input")), settings.max_payload_bytes)
    except PayloadRejectedError as exc:
        code = "too-large" if isinstance(exc, PayloadTooLargeError) else "bad-request"
        raise GatewayMessageError(str(exc), code) from None
    return StartRun(
        tenant=tenant,
        workflow=workflow,
        input=data.get("input"),
        run_id=run_id,
        tags=tags,
        search_attributes=attributes,
        stripped_tags=stripped,
    )


def _tags(value: object) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    if value is None:
        return None, ()
    if not isinstance(value, list) or len(value) > _MAX_TAGS:
        raise GatewayMessageError(f"tags must be a list of at most {_MAX_TAGS} strings")
    for tag in value:
        if not isinstance(tag, str) or not tag or len(tag) > _MAX_TAG_CHARS:
            raise GatewayMessageError(
                f"each tag must be a string of 1 to {_MAX_TAG_CHARS} characters"
            )
    kept = tuple(t for t in value if not t.startswith(ENGINE_MINTED_TAG_PREFIXES))
    stripped = tuple(t for t in value if t.startswith(ENGINE_MINTED_TAG_PREFIXES))
    return kept, stripped


def _search_attributes(value: object) -> dict[str, str | int | float | bool] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > _MAX_ATTRIBUTES:
        raise GatewayMessageError(
            f"searchAttributes must be an object of at most {_MAX_ATTRIBUTES} keys"
        )
    out: dict[str, str | int | float | bool] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key or len(key) > _MAX_TAG_CHARS:
            raise GatewayMessageError("searchAttributes keys must be non-empty strings")
        if not isinstance(item, (str, int, float, bool)):
            raise GatewayMessageError(
                f"searchAttributes[{key[:40]!r}] must be a string, number or bool"
            )
        out[key] = item
    return out


# ------------------------------------------------------------------ run requests and replies


@dataclass(frozen=True, slots=True)
class RunRequest:
    """One verb a tenant asks the control plane for (`body` holds its arguments)."""

    request_id: str
    tenant: str
    kind: str
    body: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def request_id_of(data: Mapping[str, Any]) -> str | None:
    """The request id when it is one a reply can carry back, else None (then no reply can
    reach the asker, and the request is only logged)."""
    value = data.get("requestId")
    if isinstance(value, str) and value and len(value) <= _MAX_ID_CHARS and value.isprintable():
        return value
    return None


def parse_run_request(
    data: Mapping[str, Any], settings: GatewaySettings, *, now_ms: int
) -> RunRequest:
    """The request; `GatewayMessageError` for one that is too large, unsigned (with a
    secret), from an unreadable tenant, or of an unknown kind. Call `request_id_of` first:
    a request without a usable id is never answered."""
    request_id = request_id_of(data)
    if request_id is None:
        raise GatewayMessageError("requestId must be a non-empty string")
    if _size(data) > settings.max_message_bytes:
        raise GatewayMessageError(
            f"request is larger than {settings.max_message_bytes} bytes", "too-large"
        )
    tenant = _tenant_of(data, settings, now_ms, signed=True)
    body = data.get("body")
    if not isinstance(body, dict):
        raise GatewayMessageError("body must be an object with a kind")
    kind = body.get("kind")
    if not isinstance(kind, str) or kind not in RUN_REQUEST_KINDS:
        shown = kind[:40] if isinstance(kind, str) else kind
        raise GatewayMessageError(f"unknown run request kind {shown!r}", "unknown-kind")
    return RunRequest(request_id=request_id, tenant=tenant, kind=kind, body=body)


def ok_reply(request_id: str, data: Any) -> dict[str, Any]:
    return {"requestId": request_id, "result": {"ok": True, "data": wire_json(data)}}


def error_reply(request_id: str, message: str, code: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"message": message}
    if code is not None:
        error["code"] = code
    return {"requestId": request_id, "result": {"ok": False, "error": error}}


def wire_json(value: Any) -> Any:
    """`value` as reply data: data objects by their JSON form, dates as ISO strings."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return wire_json(to_json())
    if isinstance(value, datetime):
        return iso_ms(value)
    if isinstance(value, Mapping):
        return {str(k): wire_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [wire_json(v) for v in value]
    return str(value)


# ------------------------------------------------------------------ the transport's part

# The channel protocols (GatewayChannel, TenantChannel and their handler types) live with the
# transport contract, the layer below.
