"""Every run id addressable in the API's paths, `/` included.

A run id may contain `/` (`orders/2024/17` is a valid id). The console's links and API client
percent-encode each path segment (`runs/orders%2F2024%2F17/cancel`), but an ASGI server hands
the application the path DECODED (`scope["path"]`), where that id's slashes can no longer be
told from the ones between segments: `runs/{run_id}` would never match it, and a greedy
`{run_id:path}` would make `runs/a/cancel` ambiguous (the run `a` cancelled, or the detail of
the run `a/cancel`?).

Decision: the API routes on the path as the client sent it. `RawSegments` rebuilds the path
from `scope["raw_path"]` one segment at a time — each segment decoded, with the `/` and `%`
inside it kept escaped (`%2F`, `%25`) — so the route table sees one segment per segment the
client wrote, and `path_param` decodes a matched parameter back to the id. A literal `/` is
always a separator; an id holding one must be sent encoded (which the console does).

Without `raw_path` (an ASGI server that does not send it; uvicorn, hypercorn and httpx do) the
path is routed as it is, and an id holding `/` is not reachable through the API. A proxy in
front of the console must pass the path on unmodified (nginx: `proxy_pass` without a URI part).
"""

from __future__ import annotations

from urllib.parse import unquote

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["RawSegments", "path_param"]

#: Set on the scope when the path was rebuilt: parameters are then still escaped.
_ESCAPED = "durably.escaped_segments"


def _segment(raw: str) -> str:
    return unquote(raw).replace("%", "%25").replace("/", "%2F")


def _rebuilt(scope: Scope) -> str | None:
    """The path with segment-internal `/` and `%` escaped, or None to route as is."""
    raw = scope.get("raw_path")
    if not isinstance(raw, bytes | bytearray):
        return None
    text = bytes(raw).split(b"?", 1)[0].decode("latin-1")
    if "%" not in text:
        return None  # nothing was encoded: the decoded path is the same
    path = "/".join(_segment(part) for part in text.split("/"))
    root = scope.get("root_path", "") or ""
    # The mount point must still prefix the path (a mount path holding `%` would not).
    return path if path.startswith(root) else None


class RawSegments:
    """ASGI wrapper routing the inner app on the client's own segments (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            path = _rebuilt(scope)
            if path is not None:
                scope = {**scope, "path": path, _ESCAPED: True}
        await self.app(scope, receive, send)


def path_param(request: Request, name: str) -> str:
    """A path parameter as the client meant it (a run id with its `/` back)."""
    value: str = request.path_params[name]
    return unquote(value) if request.scope.get(_ESCAPED) else value
