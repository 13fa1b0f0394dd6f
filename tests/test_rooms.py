"""Tests and benches in their own rooms: a test module imports what it shares from tests/support/
(and bench/'s harness as `bench.NAME`), never from another test module or a conftest, and no
file under tests/ edits sys.path.

A test module that imports another makes the first one's helpers a contract nobody wrote down:
moving or deleting a test then breaks a file that only borrowed from it, and pytest collects the
borrowed tests' module twice over. An edited sys.path makes a module importable under a second
name, and what a test imports then depends on which test ran first. Read with `ast`: nothing
is imported and nothing runs.

The package's own rooms too (issue #40): no folder of it holds more than 12 modules, every folder
installs, and in protocol/ and training/ each room imports only what its row of the README's
"Rooms" table allows, the table naming every module of each room."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from tests.support.import_graph import cycles, import_graph

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


# Issue #40: rooms a reader sees from the tree. A folder of more than a dozen modules side by side
# hides its layers; a README's table of rooms says them, and is checked against the imports.
MAX_FOLDER_MODULES = 12
# the folders whose README.md has a "Rooms" table: folder -> the package it installs as
ROOMED = {"protocol": "sapo.protocol", "training": "sapo.training"}
CODE = re.compile(r"`([^`]+)`")


def crowded(folders: list[Path], root: Path = ROOT) -> list[str]:
    """'folder: N modules' for each of `folders` with more than MAX_FOLDER_MODULES (its __init__ aside)."""
    counts = {folder: [p for p in folder.glob("*.py") if p.name != "__init__.py"] for folder in folders}
    return [
        f"{folder.relative_to(root)}: {len(m)} modules" for folder, m in counts.items() if len(m) > MAX_FOLDER_MODULES
    ]


def package_folders() -> list[Path]:
    return [
        path
        for top in PACKAGE
        for path in sorted([ROOT / top, *(ROOT / top).rglob("*")])
        if path.is_dir() and "__pycache__" not in path.parts
    ]


def rooms_on_disk(folder: Path) -> dict[str, set[str]]:
    """A folder's rooms: each sub-package ('wire/') with its modules' files, each top module ('network.py')."""
    rooms = {f"{d.name}/": {p.name for p in d.glob("*.py") if p.name != "__init__.py"} for d in folder.iterdir()}
    rooms = {name: modules for name, modules in rooms.items() if (folder / name / "__init__.py").is_file()}
    return rooms | {p.name: {p.name} for p in folder.glob("*.py") if p.name != "__init__.py"}


def room_table(readme: str) -> dict[str, tuple[set[str], set[str]]]:
    """The "Rooms" table of a README: room -> (the modules its row names, the rooms it may import)."""
    section = readme.split("\n## Rooms\n", 1)[1].split("\n#", 1)[0] if "\n## Rooms\n" in readme else ""
    table = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and CODE.fullmatch(cells[0]):
            names = set(CODE.findall(cells[1]))
            table[cells[0].strip("`")] = ({n for n in names if n.endswith(".py")}, set(CODE.findall(cells[2])))
    return table


def room_of(module: str, package: str, rooms: set[str]) -> str | None:
    """The room of `package` that `module` is in: 'wire/' or 'network.py'; None outside it (or its __init__)."""
    if not module.startswith(package + "."):
        return None
    first = module[len(package) + 1 :].split(".")[0]
    return f"{first}/" if f"{first}/" in rooms else f"{first}.py"


def room_disagreements(
    table: dict[str, tuple[set[str], set[str]]], rooms: dict[str, set[str]], graph: dict[str, set[str]], package: str
) -> list[str]:
    """What a Rooms table gets wrong about the rooms on disk and the import graph."""
    problems = [f"no row for {room}" for room in sorted(rooms.keys() - table.keys())]
    problems += [f"a row for {room}, which is no room" for room in sorted(table.keys() - rooms.keys())]
    for room, (named, allowed) in sorted(table.items()):
        if room.endswith("/") and room in rooms:
            problems += [f"{room}'s row does not name {m}" for m in sorted(rooms[room] - named)]
            problems += [f"{room}'s row names {m}, which is not in it" for m in sorted(named - rooms[room])]
        problems += [f"{room} may import {other}, which is no room" for other in sorted(allowed - rooms.keys())]
    rules = {room: allowed for room, (_, allowed) in table.items()}
    problems += [f"the table lets rooms import each other: {' <-> '.join(c)}" for c in cycles(rules)]
    for importer, targets in sorted(graph.items()):
        here = room_of(importer, package, set(rooms))
        for target in sorted(targets):
            there = room_of(target, package, set(rooms))
            if here and there and there != here and there not in rules.get(here, set()):
                problems.append(f"{importer} ({here}) imports {target} ({there}), which its row does not allow")
    return problems


def test_no_folder_of_the_package_holds_more_than_twelve_modules():
    found = crowded(package_folders())
    assert not found, f"over {MAX_FOLDER_MODULES} modules side by side (give the folder rooms):\n" + "\n".join(found)


def test_every_folder_of_the_package_installs():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(["sapo", *f.relative_to(ROOT).parts]) for f in package_folders() if (f / "__init__.py").is_file()}
    assert not found - listed, f"pyproject.toml's packages leave out {sorted(found - listed)}: a wheel would lack them"


def test_each_room_imports_only_what_its_row_allows():
    graph = import_graph()
    problems = [
        f"{folder}/README.md: {problem}"
        for folder, package in ROOMED.items()
        for problem in room_disagreements(
            room_table((ROOT / folder / "README.md").read_text(encoding="utf-8")),
            rooms_on_disk(ROOT / folder),
            graph,
            package,
        )
    ]
    assert not problems, "the rooms and their table disagree:\n" + "\n".join(problems)


def test_the_room_checks_catch_what_they_are_for(tmp_path):
    readme = (
        "# p/\n\n## Rooms\n\n| room | holds | may import |\n|---|---|---|\n"
        "| `low/` | `a.py` | nothing |\n| `high/` | `b.py`, `c.py` | `low/`, `top.py` |\n"
        "| `top.py` | settings | nothing |\n\n## Next\n| `x/` | `y.py` | `z/` |\n"
    )
    table = room_table(readme)
    assert table == {
        "low/": ({"a.py"}, set()),
        "high/": ({"b.py", "c.py"}, {"low/", "top.py"}),
        "top.py": (set(), set()),
    }
    rooms = {"low/": {"a.py"}, "high/": {"b.py", "c.py"}, "top.py": {"top.py"}}
    fine = {"p.high.b": {"p.low.a", "p.top", "p.high.c", "p", "q.elsewhere"}, "p.low.a": set()}
    assert room_disagreements(table, rooms, fine, "p") == []
    wrong = {**fine, "p.low.a": {"p.high.b"}}
    assert room_disagreements(table, rooms, wrong, "p") == [
        "p.low.a (low/) imports p.high.b (high/), which its row does not allow"
    ]
    moved = {"low/": {"a.py", "d.py"}, "high/": {"b.py"}, "top.py": {"top.py"}, "new/": set()}
    assert room_disagreements(table, moved, {}, "p") == [
        "no row for new/",
        "high/'s row names c.py, which is not in it",
        "low/'s row does not name d.py",
    ]
    looped = {**table, "low/": ({"a.py"}, {"high/"})}
    assert room_disagreements(looped, rooms, {}, "p") == ["the table lets rooms import each other: high/ <-> low/"]
    (tmp_path / "full").mkdir()
    for name in ["__init__", *(f"m{n}" for n in range(MAX_FOLDER_MODULES))]:
        (tmp_path / "full" / f"{name}.py").write_text("")
    assert crowded([tmp_path / "full"], tmp_path) == []
    (tmp_path / "full" / "one_more.py").write_text("")
    assert crowded([tmp_path / "full"], tmp_path) == [f"full: {MAX_FOLDER_MODULES + 1} modules"]
