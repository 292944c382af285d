"""The layout rules, checked on the source (AST), not by convention:

* a framework (torch, paddle, transformers) is imported only by modules inside a folder named after it
  (``graphjit/backends/torch/``, ``graphjit/bench/paddle/``, ...), imports inside functions included;
* no import cycle among graphjit's modules (imports inside functions count: they are still a dependency;
  imports under ``if TYPE_CHECKING:`` do not: they run no code);
* no module over 600 lines.

``python tests/test_layout.py`` prints the import graph's cycles and the longest modules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "graphjit"
FRAMEWORKS = {"torch": "torch", "paddle": "paddle", "transformers": "torch"}  # import -> the folder it needs
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = list((path.relative_to(ROOT) if path.is_relative_to(ROOT) else Path(path.name)).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` names, a relative one resolved against ``package``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(path: Path) -> list[tuple[str, int]]:
    """``(absolute module, line)`` of every import statement in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, package)
            out.append((target, node.lineno))
            out.extend((f"{target}.{alias.name}", node.lineno) for alias in node.names)  # submodules imported by name
    return out


def dependencies(path: Path, modules: set[str]) -> set[str]:
    """The graphjit modules ``path`` depends on: ``from . import env`` is a dependency on ``graphjit.env``
    only (the package is already initialised), ``from .keys import Key`` on ``graphjit.keys``."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, package)
            subs = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
            if subs:
                out.update(subs)
                if len(subs) < len(node.names) and target in modules:
                    out.add(target)
            elif target in modules:
                out.add(target)
    return out


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:`` (imports for annotations only run no code)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: dependencies(p, set(modules)) - {m} for m, p in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def framework_imports_outside_their_folder() -> list[str]:
    bad = []
    for p in sorted(PACKAGE.rglob("*.py")):
        folders = set(p.relative_to(PACKAGE).parts[:-1])
        for target, line in imports(p):
            top = target.split(".")[0]
            if top in FRAMEWORKS and FRAMEWORKS[top] not in folders:
                bad.append(f"{p.relative_to(ROOT)}:{line} imports {target}")
    return bad


def long_modules() -> list[tuple[int, str]]:
    sizes = [(len(p.read_text().splitlines()), str(p.relative_to(ROOT))) for p in PACKAGE.rglob("*.py")]
    return sorted(sizes, reverse=True)


def test_frameworks_are_imported_only_in_their_folders() -> None:
    assert framework_imports_outside_their_folder() == []


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_no_module_over_600_lines() -> None:
    assert [(n, m) for n, m in long_modules() if n > MAX_LINES] == []


def test_the_rules_see_a_violation(tmp_path: Path) -> None:
    """The checks are not vacuous: a framework import and a cycle in a scratch package are found."""
    a = tmp_path / "a.py"
    a.write_text("def f():\n    import torch\n")
    assert any(t == "torch" for t, _ in imports(a))
    assert cycles({"x": {"y"}, "y": {"x"}, "z": set()}) == [["x", "y"]]


if __name__ == "__main__":
    found = cycles(graph())
    print(f"{len(found)} import cycle(s)")
    for c in found:
        print("  " + " <-> ".join(c))
    print("framework imports outside their folders:", *framework_imports_outside_their_folder() or ["none"],
          sep="\n  ")
    print("longest modules:")
    for n, m in long_modules()[:8]:
        print(f"  {n:5d} {m}")
