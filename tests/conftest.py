"""Shared pytest configuration: make the src-layout package importable without installing it.

This checkout's `src` goes first on the path (so an installed durably from another checkout
never shadows it), unless `PYTHONPATH` already names a folder holding a `durably` package:
then that one is tested, as asked (e.g. `PYTHONPATH=/other/checkout/src pytest tests/...` runs
these tests against another version of the code).
"""

from __future__ import annotations

import gc
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.pool import Pool

_SRC = str(Path(__file__).resolve().parent.parent / "src")


def _chosen_by_pythonpath() -> bool:
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return any(entry and (Path(entry) / "durably" / "__init__.py").is_file() for entry in entries)


if _SRC not in sys.path and not _chosen_by_pythonpath():
    sys.path.insert(0, _SRC)

# The engine fixtures (`engine_factory`, `uid`) of every runtime suite. Loaded as a plugin,
# after the path above is set, so it imports this checkout's durably.
# The testing kit's plugin too: pyproject.toml turns off its entry point (`-p no:durably`),
# which would import an installed durably before this file chose the checkout.
pytest_plugins = ["tests.engine_support", "durably.testing.pytest_plugin"]


# ------------------------------------------------------------------ leaked connections

# SQLAlchemy warns from the garbage collector when it finds a pooled connection that was
# never returned ("The garbage collector is trying to clean up non-checked-in connection"):
# a close that left a connection checked out. The warning is raised inside a gc callback,
# where it fails nothing, at whatever later moment the collector runs. So every pool
# checkout and checkin is tracked, and a test that ends with a connection it checked out
# still out gets a full collection under a recording filter: the leak then fails the test
# that made it. (A full collection after every test would cost minutes of suite time.)
_LEAK = "non-checked-in connection"
_checked_out: set[int] = set()


@event.listens_for(Pool, "checkout")
def _on_checkout(_dbapi: Any, record: Any, _proxy: Any) -> None:
    _checked_out.add(id(record))


@event.listens_for(Pool, "checkin")
def _on_checkin(_dbapi: Any, record: Any) -> None:
    _checked_out.discard(id(record))


@pytest.fixture(autouse=True)
def _no_connection_left_checked_out() -> Iterator[None]:
    before = set(_checked_out)
    yield
    if not _checked_out - before:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    leaked = [str(w.message) for w in caught if _LEAK in str(w.message)]
    if leaked:
        pytest.fail(
            f"a connection was left checked out (found by the garbage collector): {leaked[0]}",
            pytrace=False,
        )
