"""durably's pytest plugin: the `durably_env` fixture, the `durably` marker and the
`--durably-store` option. Installing durably registers it (the `pytest11` entry point), so a
project's tests use it without a conftest line.

    async def test_checkout(durably_env):
        env = await durably_env(workflows=[checkout], steps=[charge])
        assert await env.run(checkout, order) == "paid"

`durably_env` is a factory: each call opens a `WorkflowEnvironment` in the test's event loop,
with the keywords given, and every one it opened is closed when the test ends. Defaults come
from, strongest first: the call's keywords, the test's `@pytest.mark.durably(...)` keywords,
then `--durably-store=memory|sqlite|<url>` for the store (the run's choice, so one suite runs
on PostgreSQL without edits), else `"memory"`. The fixture is async, so the test needs an
async runner: with pytest-asyncio in strict mode mark the test `@pytest.mark.asyncio`.

Only pytest imports this module: `import durably` never loads pytest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from durably.testing.environment import STORE_KINDS, WorkflowEnvironment

__all__ = ["EnvironmentFactory", "durably_env", "durably_store"]

_OPTION = "--durably-store"
_MARKER = "durably"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("durably")
    group.addoption(
        _OPTION,
        default=None,
        metavar="STORE",
        help=(
            "the store of every durably_env environment: memory (the default), sqlite "
            "(a temporary file per environment) or a store URL such as postgresql://…"
        ),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(**options): defaults of the durably_env environments of this test "
        "(store=, workflows=, steps=, time_skipping=, any Engine option)",
    )
    _store_of(config)  # a bad --durably-store stops the run before any test


class EnvironmentFactory:
    """`await factory(**options)` opens a `WorkflowEnvironment` with `defaults` under
    `options`; `close()` closes every one it opened, newest first."""

    def __init__(self, defaults: dict[str, Any]):
        self.defaults = defaults
        self.opened: list[WorkflowEnvironment] = []

    async def __call__(self, **options: Any) -> WorkflowEnvironment:
        env = WorkflowEnvironment(**{**self.defaults, **options})
        await env.open()
        self.opened.append(env)
        return env

    async def close(self) -> None:
        while self.opened:
            await self.opened.pop().close()


def _store_of(config: pytest.Config) -> str:
    chosen = config.getoption(_OPTION)
    if chosen is None:
        return "memory"
    if not isinstance(chosen, str) or not chosen.strip():
        raise pytest.UsageError(f"{_OPTION}: one of {', '.join(STORE_KINDS)} or a store URL")
    if chosen not in STORE_KINDS and "://" not in chosen:
        raise pytest.UsageError(
            f"{_OPTION}={chosen!r}: one of {', '.join(STORE_KINDS)} or a store URL "
            "(postgresql://…, sqlite:///path.db)"
        )
    return chosen


@pytest.fixture
def durably_store(request: pytest.FixtureRequest) -> str:
    """The store this run gives `durably_env` (`--durably-store`, else "memory")."""
    return _store_of(request.config)


def _defaults(request: pytest.FixtureRequest, store: str) -> dict[str, Any]:
    defaults: dict[str, Any] = {"store": store}
    # The closest marker wins (a test's over its class's over its module's).
    for marker in reversed(list(request.node.iter_markers(_MARKER))):
        if marker.args:
            raise pytest.UsageError(
                f"@pytest.mark.{_MARKER} takes keywords only (store=, workflows=, …), "
                f"not {marker.args!r}"
            )
        defaults.update(marker.kwargs)
    return defaults


async def _durably_env(
    request: pytest.FixtureRequest, durably_store: str
) -> AsyncIterator[EnvironmentFactory]:
    factory = EnvironmentFactory(_defaults(request, durably_store))
    try:
        yield factory
    finally:
        await factory.close()


def _needs_an_async_runner() -> EnvironmentFactory:
    pytest.fail("durably_env is an async fixture: install pytest-asyncio to use it")


def _fixture() -> Any:
    """`durably_env` as pytest-asyncio's fixture (in strict and auto mode alike), or, without
    pytest-asyncio, one that says what it needs when a test uses it."""
    try:
        import pytest_asyncio
    except ImportError:
        return pytest.fixture(_needs_an_async_runner, name="durably_env")
    return pytest_asyncio.fixture(_durably_env, name="durably_env")


durably_env: Any = _fixture()
"""A factory of `WorkflowEnvironment`s (module doc), closed at the test's end."""
