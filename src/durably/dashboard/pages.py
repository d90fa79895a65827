"""HTML served by the dashboard: the console shell from package data and the built-in auth
pages. Nothing is fetched from elsewhere at run time."""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import PurePosixPath

__all__ = [
    "ASSET_TYPES",
    "CONSOLE_PAGES",
    "PUBLIC_ASSETS",
    "asset_bytes",
    "asset_type",
    "index_html",
    "login_page",
    "session_required_page",
]

ASSET_TYPES = {
    ".js": "application/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".map": "application/json; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json; charset=utf-8",
    ".woff2": "font/woff2",
    ".ico": "image/x-icon",
}
_CONFIG_MARK = "<!--durable-config-->"
#: The console's pages: `<base>/<page>` and every path below it serve the console's shell
#: (`index.html`), whose client-side router then opens the page the path names.
CONSOLE_PAGES = ("runs", "workers", "signals", "schedules")


def _static() -> resources.abc.Traversable:
    return resources.files("durably.dashboard").joinpath("static")


def index_html(base: str, api: str, read_only: bool = False) -> str | None:
    """`index.html` with its asset URLs under `base` and the bases in a non-executed JSON
    block `<script type="application/json" id="durable-config">`; None when missing."""
    page = _static().joinpath("index.html")
    if not page.is_file():
        return None
    text = page.read_text(encoding="utf-8")
    prefix = base.rstrip("/")
    text = text.replace('"./assets/', f'"{prefix}/assets/')
    config = json.dumps({"base": base, "api": api, "readOnly": read_only})
    config = config.replace("<", "\\u003c")
    block = f'<script type="application/json" id="durable-config">{config}</script>'
    return text.replace(_CONFIG_MARK, block) if _CONFIG_MARK in text else text + block


def asset_bytes(name: str) -> bytes | None:
    """A built asset by bare file name (no directories, no dot files); None when absent."""
    if not name or PurePosixPath(name).name != name or name in (".", "..") or "\\" in name:
        return None
    asset = _static().joinpath("assets").joinpath(name)
    if not asset.is_file():
        return None
    return asset.read_bytes()


def asset_type(name: str) -> str:
    suffix = PurePosixPath(name).suffix.lower()
    return ASSET_TYPES.get(suffix, "application/octet-stream")


#: Assets the login and session-required pages use; served without a session (they are
#: the same for everyone and reveal nothing).
PUBLIC_ASSETS = frozenset({"login.js", "login.css"})


def login_page(action: str, assets: str) -> str:
    """The built-in login form (Mode B). Its script (`login.js`) reads `returnTo`/`error`
    client-side and POSTs JSON to the form's `action`; nothing is inline, so the console's
    Content-Security-Policy (own assets only) holds on this page too."""
    a, base = html.escape(action), html.escape(assets)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in · durably console</title>
<link rel="stylesheet" href="{base}/login.css">
<script type="module" src="{base}/login.js"></script></head>
<body><form id="login" method="post" action="{a}">
<h1>durably console</h1><div id="error" role="alert"></div>
<label for="username">Username</label>
<input id="username" name="username" autocomplete="username" required>
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password">
<button type="submit">Sign in</button></form></body></html>
"""


def session_required_page(assets: str) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Session required · durably console</title>
<link rel="stylesheet" href="{html.escape(assets)}/login.css"></head><body><section>
<h1>Session required</h1>
<p>Sign in to the application that hosts this console, then reload this page.</p>
</section></body></html>
"""
