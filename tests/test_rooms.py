"""Tests and benches in their own rooms: a test module imports what it shares from tests/support/
(and bench/'s harness as `bench.NAME`), never from another test module or a conftest, and no
file under tests/ edits sys.path.

A test module that imports another makes the first one's helpers a contract nobody wrote down:
moving or deleting a test then breaks a file that only borrowed from it, and pytest collects the
borrowed tests' module twice over. An edited sys.path makes a module importable under a second
name, and what a test imports then depends on which test ran first. Read with `ast`: nothing
is imported and nothing runs."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def module_name(path: Path) -> str:
    """`tests/node/core/test_intake.py` -> `tests.node.core.test_intake` (a package's __init__: the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, name: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every import in `source`, the module `name`; relative imports resolved.
    `from a import b` counts as a.b too, since b may be a module."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                stem = ".".join([*base, *([node.module] if node.module else [])])
            else:
                stem = node.module or ""
            found += [(node.lineno, stem), *((node.lineno, f"{stem}.{alias.name}") for alias in node.names)]
    return found


def is_test_module(module: str) -> bool:
    """A module pytest collects or loads as a plugin: tests/**/test_*.py, or a conftest (a file,
    not a name imported from one that happens to start with test_)."""
    parts = module.split(".")
    is_test = parts[0] == "tests" and (parts[-1].startswith("test_") or parts[-1] == "conftest")
    return is_test and ROOT.joinpath(*parts).with_suffix(".py").is_file()


def borrowed(source: str, name: str, is_package: bool = False) -> list[str]:
    """'line: module' for each test module or conftest that the module `name` imports."""
    return [
        f"{line}: {module}"
        for line, module in imported_modules(source, name, is_package)
        if is_test_module(module) and module != name
    ]


def sys_path_edits(source: str) -> list[int]:
    """Lines that change sys.path: a call on it (insert, append, ...), an assignment to it or to a
    slice of it, pytest's monkeypatch.syspath_prepend, or site.addsitedir."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver, method = node.func.value, node.func.attr
            if _is_sys_path(receiver) or method in ("syspath_prepend", "addsitedir"):
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if _is_sys_path(target.value if isinstance(target, ast.Subscript) else target):
                    lines.append(node.lineno)
    return sorted(lines)


def _is_sys_path(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def python_files() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts)


def test_no_test_module_imports_another_or_a_conftest():
    found = [
        f"{path.relative_to(ROOT)}:{where}"
        for path in python_files()
        for where in borrowed(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")
    ]
    assert not found, "imports of a test module or a conftest (move what they share to tests/support/):\n" + "\n".join(
        found
    )


def test_nothing_under_tests_edits_sys_path():
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in python_files()
        for line in sys_path_edits(path.read_text(encoding="utf-8"))
    ]
    assert not found, (
        "sys.path edited (import bench/ as `bench.NAME` and helpers from tests/support/ instead):\n" + "\n".join(found)
    )


def test_the_checks_catch_what_they_are_for():
    source = (
        "import sys\n"
        "from tests.protocol.test_gossip import start_node\n"
        "from tests import conftest\n"
        "from .test_relay import kinds\n"
        "from tests.support.gossip import start_node as fine\n"
        "from bench import nat\n"
        "sys.path.insert(0, 'bench')\n"
        "sys.path[:0] = ['bench']\n"
        "def test(monkeypatch):\n"
        "    monkeypatch.syspath_prepend('bench')\n"
        "    print(sys.path)  # reading it is fine\n"
    )
    assert borrowed(source, "tests.protocol.test_signing") == [
        "2: tests.protocol.test_gossip",
        "3: tests.conftest",
        "4: tests.protocol.test_relay",
    ]
    assert sys_path_edits(source) == [7, 8, 10]
    assert module_name(TESTS / "support" / "__init__.py") == "tests.support"


# Issue #40: a module a reader can hold in mind, a function that fits on a screen.
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80
PACKAGE = ("node", "protocol", "sampling", "training")


def oversized(source: str, name: str) -> list[str]:
    """What of `source` (module `name`) is over the bounds: the module, and each function."""
    found = [f"{name}: {len(source.splitlines())} lines"] if len(source.splitlines()) > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_module_or_function_of_the_package_is_over_its_bound():
    found = [
        where
        for folder in PACKAGE
        for path in sorted((ROOT / folder).rglob("*.py"))
        for where in oversized(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert not found, f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function:\n" + "\n".join(found)
    long_function = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert oversized(long_function, "m") == [f"m:1 f: {MAX_FUNCTION_LINES + 1} lines"]
