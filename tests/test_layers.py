"""The runtime's import structure: no large import cycles, and none hidden in functions.

The layers themselves (`_core` → `_store` → `_read` → `_engine` → …) are checked by the
import-linter contracts in pyproject.toml (`lint-imports`). These tests check what a
layers contract cannot: inside the runtime package `durably._engine`, modules that import
each other in a cycle stay a small, tightly bound group, and no module hides a cycle by
importing another runtime module inside a function body (where the import graph above
still sees it, but a reader does not).
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

import durably

RUNTIME = "durably._engine"
RUNTIME_DIR = Path(durably.__file__).parent / "_engine"

# The largest group of runtime modules allowed to import each other in a cycle.
MAX_CYCLE = 4

# Function-level imports that are not about the runtime's structure, with their reason.
# Opening a store by URL loads the SQL store (and SQLAlchemy) only when it is asked for,
# so `import durably` stays light for code that only uses the in-memory store.
LAZY_ALLOWED = {("stores.py", "durably._store.memory"), ("stores.py", "durably._store.sql")}


def _largest_cycle(exclude_type_checking: bool) -> list[str]:
    graph = grimp.build_graph("durably", exclude_type_checking_imports=exclude_type_checking)
    modules = sorted(m for m in graph.modules if m.startswith(RUNTIME + "."))
    edges = {
        m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in modules)
        for m in modules
    }
    return max(_strongly_connected(modules, edges), key=len)


def _strongly_connected(nodes: list[str], edges: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit to worry about)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            recursed = False
            for j in range(i, len(edges[node])):
                nxt = edges[node][j]
                if nxt not in index:
                    work.append((node, j + 1))
                    work.append((nxt, 0))
                    recursed = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if recursed:
                continue
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return components


def test_strongly_connected_finds_cycles() -> None:
    # The helper itself: a 3-cycle, a 2-cycle hanging off it, and a leaf.
    edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": ["e"], "e": ["d", "f"], "f": []}
    found = sorted(_strongly_connected(sorted(edges), edges))
    assert found == [["a", "b", "c"], ["d", "e"], ["f"]]


def test_runtime_import_cycles_stay_small() -> None:
    cycle = _largest_cycle(exclude_type_checking=True)
    with_type_hints = _largest_cycle(exclude_type_checking=False)
    # Reported for a maintainer reading the test output (`pytest -s`): imports made only
    # for type hints (under `if TYPE_CHECKING:`) never run, so they cannot form a cycle
    # at import time; they are shown, not limited.
    # A group of one module is no cycle (a module does not import itself).
    print(
        f"largest runtime import cycle: {len(cycle)} modules {cycle}"
        if len(cycle) > 1
        else "no runtime import cycles"
    )
    print(f"counting type-hint-only imports: {len(with_type_hints)} modules")
    assert len(cycle) <= MAX_CYCLE, (
        f"{len(cycle)} runtime modules import each other in a cycle (at most {MAX_CYCLE} "
        f"allowed): {cycle}. Pass the collaborator in (a callable or a small Protocol) or "
        "move the shared piece to a leaf module instead of importing upward."
    )


def _function_level_imports(path: Path) -> list[tuple[int, str]]:
    """`durably` imports inside function bodies, except under `if TYPE_CHECKING:`."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for orelse in child.orelse:
                    visit_one(orelse, in_function)
                continue
            visit_one(child, in_function)

    def visit_one(node: ast.AST, in_function: bool) -> None:
        if in_function and isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module and node.module.split(".")[0] == "durably":
                found.append((node.lineno, node.module))
        if in_function and isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "durably":
                    found.append((node.lineno, alias.name))
        if in_function and isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append((node.lineno, "." * node.level + (node.module or "")))
        nested = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        visit(node, nested)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def test_function_level_import_detection(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import durably\n"
        "def f():\n"
        "    from durably._engine import driver\n"
        "    if TYPE_CHECKING:\n"
        "        from durably._engine.engine import Engine\n"
        "    import json\n"
        "class C:\n"
        "    async def g(self):\n"
        "        def h():\n"
        "            import durably._core.models\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert _function_level_imports(path) == [(4, "durably._engine"), (11, "durably._core.models")]


@pytest.mark.parametrize("path", sorted(RUNTIME_DIR.glob("*.py")), ids=lambda p: p.name)
def test_no_function_level_imports_in_runtime(path: Path) -> None:
    hidden = [
        f"{path.name}:{line} imports {module}"
        for line, module in _function_level_imports(path)
        if (path.name, module) not in LAZY_ALLOWED
    ]
    assert not hidden, (
        "imports inside function bodies hide the module structure (and often a cycle); "
        "import at module level and break the cycle instead: " + "; ".join(hidden)
    )
