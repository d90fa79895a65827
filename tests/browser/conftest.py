"""Browser tests of the console: Debian's Chromium driven by Playwright against a dashboard
served by uvicorn on localhost, in the test's own event loop (so the engine that the app
reads keeps driving runs while the browser watches).

- Chromium is `/usr/bin/chromium` (`apt-get install chromium`; `.ci/run` installs it), never a
  Playwright-downloaded build. Without it (or without the `playwright` package) the tests are
  skipped — unless `DURABLY_REQUIRE_SERVICES=1` (set by `.ci/run`), which makes that a failure.
- Screenshots go to `test-output/browser/` at the repository root.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pg_support import services_required

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "browser"


def require_browser() -> None:
    """Skip the calling test when Chromium or Playwright is missing (fail if required)."""
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package (pip install -e '.[dev]')")
    if not missing:
        return
    message = "browser tests need " + " and ".join(missing)
    if services_required():
        pytest.fail(f"{message} (DURABLY_REQUIRE_SERVICES=1: services are required)")
    pytest.skip(message)


@pytest.fixture
def shots() -> Path:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    return OUTPUT


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """A headless Chromium; Playwright gives each launch a fresh temporary profile and each
    `new_context()` an empty cache."""
    require_browser()
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield launched
        finally:
            await launched.close()


def _free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Serve `app` with uvicorn on a free localhost port as a task of the running loop;
    yields the base URL (`http://127.0.0.1:<port>/`)."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # leave pytest's signal handlers alone
            yield

    sock = _free_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn stopped before it started")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(task, 10)
        finally:
            sock.close()


def csp_watch(page: Any) -> list[str]:
    """Collects what breaks under the console's Content-Security-Policy: console messages
    reporting a CSP violation, and uncaught page errors. Assert it stays empty."""
    found: list[str] = []
    page.on(
        "console",
        lambda m: found.append(m.text) if "Content Security Policy" in m.text else None,
    )
    page.on("pageerror", lambda e: found.append(str(e)))
    return found
