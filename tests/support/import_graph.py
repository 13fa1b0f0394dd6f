"""Our import graph, read with `ast` (nothing is imported, nothing runs): every import of ours
counts, at the top of a module, inside a function and under `if TYPE_CHECKING:`. A cycle hidden
behind TYPE_CHECKING still means that neither module can be read without the other.

tests/test_import_graph.py checks its layers and renders docs/import-graph.md from it;
tests/test_architecture.py checks docs/architecture.dot's arrows against it, bench/ included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the repository's folders and the packages they install as (pyproject.toml's package-dir)
PACKAGES = {"training": "sapo.training", "sampling": "sapo.sampling", "protocol": "sapo.protocol", "node": "sapo.node"}
# ... and bench/, importable as `bench` from the repository root (bench/README.md)
WITH_BENCH = {**PACKAGES, "bench": "bench"}
# what git ignores under those folders and is not ours: bench/peers/ holds the peers' venvs (a
# folder, not a name: protocol/peers/ is ours)
NOT_OURS = ("bench/peers", "bench/results", "bench/.cache")


def module_files(folders: dict[str, str] = PACKAGES) -> dict[str, Path]:
    """Module name -> file, for every module of `folders` (folder -> the package it installs as)."""
    modules = {}
    for folder, package in folders.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = path.relative_to(ROOT)
            if "__pycache__" in where.parts or any(where.is_relative_to(place) for place in NOT_OURS):
                continue
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that `name` imports, anywhere in its file."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package this module is in
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                stem = ".".join([*base, *([node.module] if node.module else [])])
            else:
                stem = node.module or ""
            # `from a.b import c` imports a.b, and a.b.c too when c is a module
            targets = [stem, *(f"{stem}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            # `import a.b.c` where only a.b is ours (or a.b.c names an attribute): the longest module
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(folders: dict[str, str] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports."""
    modules = module_files(folders)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
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


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def package_of(module: str) -> str:
    """sapo.protocol, sapo.node.core, ...: node/'s programs apart (node/swarm.py and node/cli.py
    each count as one), and bench/ as one."""
    parts = module.split(".")
    if parts[0] == "bench":
        return "bench"
    return ".".join(parts[: 3 if parts[1:2] == ["node"] else 2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between packages (`package_of`)."""
    edges: dict[str, set[str]] = {}
    for importer, targets in graph.items():
        edges.setdefault(package_of(importer), set()).update(package_of(t) for t in targets)
    return {package: targets - {package} for package, targets in edges.items()}


def render(graph: dict[str, set[str]]) -> str:
    """docs/import-graph.md: the packages' graph, then every module's imports of ours."""
    lines = [
        "# The import graph",
        "",
        "Generated by `make docs` (`python -m tests.test_import_graph`) from every import of ours, those",
        "inside functions and under `if TYPE_CHECKING:` included. tests/test_import_graph.py checks it",
        "has no cycle, that the layers point one way, and that this page is current.",
        "",
        "## Packages",
        "",
    ]
    packages = package_graph(graph)
    lines += [
        f"- `{p}` → {', '.join(f'`{t}`' for t in sorted(packages[p])) or '(nothing of ours)'}" for p in sorted(packages)
    ]
    lines += ["", f"Cycles: {len(cycles(graph))}.", "", "## Modules", ""]
    lines += [
        f"- `{m}` → {', '.join(f'`{t}`' for t in sorted(graph[m])) or '(nothing of ours)'}" for m in sorted(graph)
    ]
    return "\n".join(lines) + "\n"
