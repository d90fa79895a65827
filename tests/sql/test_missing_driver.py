"""A PostgreSQL URL without the `postgres` extra: an error that says what to install.

Run in a subprocess with `sys.modules['asyncpg'] = None`, which makes every import of asyncpg
fail exactly as it does where the package is absent; it tests the import guard, no store."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

PROBE = """
import sys
sys.modules["asyncpg"] = None  # as if the extra were not installed
import durably
try:
    {call}
except ModuleNotFoundError as exc:
    print("ERROR", exc.name, "|", exc)
else:
    print("OPENED")
"""


def probe(call: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE).format(call=call)],
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize(
    "call",
    [
        "durably.Engine('postgresql://app@127.0.0.1:5432/app')",
        "durably.Client('postgres://app@127.0.0.1/app')",
        "durably.Engine(store='postgresql+asyncpg://app@127.0.0.1/app', drive=False)",
    ],
)
def test_a_postgresql_url_without_asyncpg_names_the_extra(call: str) -> None:
    out = probe(call)
    assert out.startswith("ERROR asyncpg |"), out
    assert "pip install 'durably[postgres]'" in out
    assert "PostgreSQL store" in out


def test_sqlite_needs_no_asyncpg() -> None:
    assert probe("durably.Engine('sqlite://')") == "OPENED"
