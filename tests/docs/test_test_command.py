"""CI runs exactly the README's test command, and that command builds the guide strictly."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_command() -> str:
    section = ROOT.joinpath("README.md").read_text().split("## Development", 1)[1]
    found = re.search(r"^\$ (ruff check .+)$", section, flags=re.M)
    assert found, "README.md's Development section shows no test command"
    return found[1]


def test_ci_runs_the_readme_command() -> None:
    ci = ROOT.joinpath(".ci", "run").read_text().splitlines()
    assert ci[-1] == _readme_command()


def test_the_command_builds_the_guide_strictly() -> None:
    assert "mkdocs build --strict" in _readme_command()
