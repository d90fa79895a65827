"""The API reference (docs/reference/*.md, rendered by mkdocstrings) documents every public
name of `durably`, so a name added to `__all__` without a page fails here."""

from __future__ import annotations

import pkgutil
import re

import durably
from tests.docs.blocks import DOCS


def test_every_public_name_has_a_reference_entry() -> None:
    text = "\n".join(p.read_text() for p in (DOCS / "reference").glob("*.md"))
    documented = set(re.findall(r"^::: durably\.(\w+)\s*$", text, flags=re.M))
    public = {name for name in durably.__all__ if not name.startswith("__")}
    assert not public - documented, f"missing from docs/reference: {sorted(public - documented)}"
    assert not documented - public, f"not public: {sorted(documented - public)}"


def test_every_testing_name_has_a_reference_entry() -> None:
    import durably.testing

    text = "\n".join(p.read_text() for p in (DOCS / "reference").glob("*.md"))
    documented = set(re.findall(r"^::: durably\.testing\.(\w+)\s*$", text, flags=re.M))
    public = set(durably.testing.__all__)
    assert not public - documented, f"missing from docs/reference: {sorted(public - documented)}"
    # A module of the package (the pytest plugin) is documented under its own name.
    modules = {m.name for m in pkgutil.iter_modules(durably.testing.__path__)}
    stray = documented - public - modules
    assert not stray, f"not in durably.testing: {sorted(stray)}"
