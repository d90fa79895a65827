"""Fixtures of the dashboard suite: a real Engine on a SQLite file and an httpx client that
drives the ASGI app in process."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from durably import Engine

FAST: dict[str, Any] = {
    "timer_poll_ms": 20,
    "lease_ms": 2000,
    "drain_timeout_ms": 2000,
    "reconcile_ms": 3000,
}
_ids = itertools.count()


@pytest.fixture
def uid() -> str:
    return f"d{next(_ids)}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with Engine(f"sqlite:///{tmp_path / 'dash.db'}", **FAST) as eng:
        yield eng


def client_for(app: Any, base: str = "http://localhost") -> httpx.AsyncClient:
    """An in-process client; `localhost` is one of the console's default allowed hosts."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base)


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.02)


async def wait_status(engine: Engine, run_id: str, *statuses: str) -> None:
    async def check() -> bool:
        run = await engine.get_run(run_id)
        return run is not None and run.status in statuses

    await wait_until(check)
