"""kproxy's module import graph has no cycle.

The graph holds every module-level import and every import under ``if TYPE_CHECKING:``
(a cycle hidden from the interpreter is still a cycle for the reader). Imports inside
functions are left out: they are the commented, deliberate lazy ones.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "kproxy"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports at module level, including inside module-level if/try blocks (TYPE_CHECKING)."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            stack.extend(node.body)
            stack.extend(node.orelse)
        elif isinstance(node, ast.Try):
            stack.extend(node.body)
            stack.extend(node.orelse)
            stack.extend(node.finalbody)
            for handler in node.handlers:
                stack.extend(handler.body)
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph() -> dict[str, set[str]]:
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    modules = {_module_name(f): f for f in files}
    graph: dict[str, set[str]] = {name: set() for name in modules}

    def target(name: str) -> str | None:
        # The module itself, or the nearest package that holds it.
        while name:
            if name in modules:
                return name
            name = name.rpartition(".")[0]
        return None

    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node in _top_level_imports(tree):
            if isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                base = _resolve(name, is_package, node)
                candidates = [f"{base}.{alias.name}" for alias in node.names]
            for candidate in candidates:
                if not candidate.startswith(PACKAGE):
                    continue
                dep = target(candidate)
                if dep is not None and dep != name:
                    graph[name].add(dep)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm; returns the components with more than one module (the cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph[node]):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_package() -> None:
    graph = import_graph()
    assert "kproxy.cli" in graph
    assert graph["kproxy.cli"], "cli imports other kproxy modules"


def test_no_import_cycles() -> None:
    cycles = strongly_connected(import_graph())
    assert cycles == [], "import cycles:\n" + "\n".join("  {" + ", ".join(c) + "}" for c in cycles)


def test_no_two_modules_share_a_name() -> None:
    """A module's name says what it holds, once: ``grep`` and tracebacks find one file."""
    by_name: dict[str, list[str]] = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        if path.name != "__init__.py":
            by_name.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}
