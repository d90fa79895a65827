"""docs/architecture.md is the maintainers' map: its module index names every module of
`src/durably` exactly once, and nothing that is gone.

A module added without a line in the index (or a line left behind by a module that moved)
fails here, so the map never drifts from the tree.
"""

from __future__ import annotations

import re
from pathlib import Path

import durably

PACKAGE = Path(durably.__file__).resolve().parent
DOC = PACKAGE.parent.parent / "docs" / "architecture.md"
HEADING = "## Module index"


def _index_section(text: str) -> str:
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return text[start : end if end != -1 else len(text)]


def _indexed(section: str) -> list[str]:
    # Each entry is a list item that opens with the module's path inside `src/durably`.
    return re.findall(r"^- `([\w/]+\.py)`", section, flags=re.M)


def test_index_names_every_module_once() -> None:
    indexed = _indexed(_index_section(DOC.read_text()))
    modules = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py"))
    duplicates = sorted({m for m in indexed if indexed.count(m) > 1})
    assert not duplicates, f"named more than once in the module index: {duplicates}"
    missing = sorted(set(modules) - set(indexed))
    assert not missing, f"modules missing from docs/architecture.md's module index: {missing}"
    stale = sorted(set(indexed) - set(modules))
    assert not stale, f"the module index names modules that do not exist: {stale}"


def test_index_reader_finds_entries() -> None:
    sample = f"{HEADING}\n\n- `a/b.py` — one\n- `c.py` — two\n\n## Next\n- `d.py` — no\n"
    assert _indexed(_index_section(sample)) == ["a/b.py", "c.py"]
