"""The import structure of `src/`: no import cycles, none hidden in functions, and the
type-only imports that point upward pinned.

The layers themselves (`_core` → `_store` → `_read` → `_engine` → …, and inside the runtime
`defs` → `flow` → `control` → `client | run` → … → `worker` → `engine`) are checked by the
import-linter contracts in pyproject.toml (`lint-imports`). These tests check what a
layers contract cannot: no two modules anywhere in the package import each other in a
cycle (a layers contract allows one inside a layer), no runtime module hides an import
inside a function body (where the import graph still sees it, but a reader does not), and
the imports made only for type hints, which the contracts do not count, point downward
except the ones listed here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

import durably

RUNTIME = "durably._engine"
RUNTIME_DIR = Path(durably.__file__).parent / "_engine"

# The largest group of modules allowed to import each other in a cycle: one module, no cycle.
MAX_CYCLE = 1

# Function-level imports that are not about the runtime's structure, with their reason.
# Opening a store by URL loads the SQL store (and SQLAlchemy) only when it is asked for,
# so `import durably` stays light for code that only uses the in-memory store.
LAZY_ALLOWED = {
    ("defs/stores.py", "durably._store.memory"),
    ("defs/stores.py", "durably._store.sql"),
}

# The runtime's sub-packages, lowest first, as the import-linter layers contract orders them
# (packages on one line are independent: neither imports the other).
RUNTIME_LAYERS = [
    {"defs"},
    {"flow"},
    {"control"},
    {"run", "client"},
    {"remote", "gateway"},
    {"triggers"},
    {"worker"},
    {"engine"},
]

# Imports made only for type hints that point up the runtime's layers, with their reason.
# A workflow definition's signature names the ctx its body is given (`WorkflowCtx`), the
# one type the definitions cannot hold themselves without holding the whole turn runtime.
TYPE_ONLY_UPWARD = {("durably._engine.defs.registry", "durably._engine.run.ctx")}


def _largest_cycle(exclude_type_checking: bool) -> list[str]:
    graph = grimp.build_graph("durably", exclude_type_checking_imports=exclude_type_checking)
    modules = sorted(graph.modules)
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


def test_import_cycles_stay_small() -> None:
    cycle = _largest_cycle(exclude_type_checking=True)
    with_type_hints = _largest_cycle(exclude_type_checking=False)
    # Reported for a maintainer reading the test output (`pytest -s`): imports made only
    # for type hints (under `if TYPE_CHECKING:`) never run, so they cannot form a cycle
    # at import time; they are shown, not limited.
    # A group of one module is no cycle (a module does not import itself).
    print(
        f"largest import cycle: {len(cycle)} modules {cycle}"
        if len(cycle) > 1
        else "no import cycles"
    )
    print(f"counting type-hint-only imports: {len(with_type_hints)} modules")
    assert len(cycle) <= MAX_CYCLE, (
        f"{len(cycle)} modules import each other in a cycle (at most {MAX_CYCLE} "
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


def _layer_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 3 or ".".join(parts[:2]) != RUNTIME:
        return None
    return next((i for i, layer in enumerate(RUNTIME_LAYERS) if parts[2] in layer), None)


def _type_only_upward() -> set[tuple[str, str]]:
    every = grimp.build_graph("durably", exclude_type_checking_imports=False)
    executed = grimp.build_graph("durably", exclude_type_checking_imports=True)
    found: set[tuple[str, str]] = set()
    for importer in every.modules:
        low = _layer_of(importer)
        if low is None:
            continue
        for imported in every.find_modules_directly_imported_by(importer):
            high = _layer_of(imported)
            if high is None or high <= low:
                continue
            if imported not in executed.find_modules_directly_imported_by(importer):
                found.add((importer, imported))
    return found


def test_runtime_layers_cover_every_sub_package() -> None:
    named = set().union(*RUNTIME_LAYERS)
    present = {p.name for p in RUNTIME_DIR.iterdir() if (p / "__init__.py").exists()}
    present |= {p.stem for p in RUNTIME_DIR.glob("*.py") if p.stem != "__init__"}
    assert present == named


def test_type_only_imports_point_downward() -> None:
    assert _type_only_upward() == TYPE_ONLY_UPWARD, (
        "an import under `if TYPE_CHECKING:` points up the runtime's layers; name a small "
        "Protocol in the lower package instead (or list it in TYPE_ONLY_UPWARD with its reason)"
    )


@pytest.mark.parametrize(
    "path", sorted(RUNTIME_DIR.rglob("*.py")), ids=lambda p: str(p.relative_to(RUNTIME_DIR))
)
def test_no_function_level_imports_in_runtime(path: Path) -> None:
    name = str(path.relative_to(RUNTIME_DIR))
    hidden = [
        f"{name}:{line} imports {module}"
        for line, module in _function_level_imports(path)
        if (name, module) not in LAZY_ALLOWED
    ]
    assert not hidden, (
        "imports inside function bodies hide the module structure (and often a cycle); "
        "import at module level and break the cycle instead: " + "; ".join(hidden)
    )
