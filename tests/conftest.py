"""Shared pytest configuration: make the src-layout package importable without installing it.

This checkout's `src` goes first on the path (so an installed durably from another checkout
never shadows it), unless `PYTHONPATH` already names a folder holding a `durably` package:
then that one is tested, as asked (e.g. `PYTHONPATH=/other/checkout/src pytest tests/...` runs
these tests against another version of the code).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_SRC = str(Path(__file__).resolve().parent.parent / "src")


def _chosen_by_pythonpath() -> bool:
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return any(entry and (Path(entry) / "durably" / "__init__.py").is_file() for entry in entries)


if _SRC not in sys.path and not _chosen_by_pythonpath():
    sys.path.insert(0, _SRC)
