"""Every repository path named in a Python comment or docstring exists. Markdown links are
checked by test_docs.py; pointers in code go stale just as quietly when a file moves (a
comment that still names round.py in node/ after it moved to node/core/ sends the reader
nowhere).

A path is a word that starts with one of the repository's top-level folders and a slash
(`node/core/round.py`, `docs/security.md`, `bench/results/`). Not checked: placeholders
(`bench/results/longrun-<time>`), and places git ignores, which scripts make (`bench/peers/`)."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

from tests.support.repository_files import files_git_keeps

ROOT = Path(__file__).resolve().parents[1]
TOP_FOLDERS = ("bench", "docker", "docs", "node", "protocol", "sampling", "tests", "training")
PATH = re.compile(rf"(?<![\w./<>-])((?:{'|'.join(TOP_FOLDERS)})/[\w./<>-]*[\w>/])")


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in a module."""
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                found.append((node.body[0].lineno, docstring))
    return found


def ignored_by_git(root: Path, paths: set[str]) -> set[str]:
    if not paths:
        return set()
    # each as a file and as a folder: a folder that is not there yet matches only a folder's pattern
    asked = [form for path in sorted(paths) for form in (path, path + "/")]
    checked = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=root,
        input="\n".join(asked),
        capture_output=True,
        text=True,
    )
    return {line.rstrip("/") for line in checked.stdout.splitlines()}


def stale_paths(root: Path) -> list[str]:
    """'file:line: path' for every path named in a comment or docstring that does not exist."""
    missing = []
    for file in files_git_keeps(root, "*.py"):
        name = file.relative_to(root).as_posix()
        for line, text in prose(file.read_text(encoding="utf-8")):
            for match in PATH.finditer(text):
                path = match.group(1).rstrip(".")
                if "<" not in path and not (root / path).exists():
                    missing.append((name, line, path))
    generated = ignored_by_git(root, {path.rstrip("/") for _, _, path in missing})
    return [f"{name}:{line}: {path}" for name, line, path in missing if path.rstrip("/") not in generated]


def test_every_path_named_in_code_exists():
    stale = stale_paths(ROOT)
    assert not stale, "comments or docstrings name paths that do not exist:\n" + "\n".join(stale)


def test_the_path_check_catches_a_renamed_file(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("bench/peers/\n")
    (tmp_path / "node" / "core").mkdir(parents=True)
    (tmp_path / "node" / "core" / "round.py").write_text('"""One round; node/core/state.py holds its state."""\n')
    (tmp_path / "node" / "core" / "state.py").write_text("")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "run.py").write_text(
        '"""Runs node/core/round.py, into bench/results/run-<time> (venvs in bench/peers/)."""\n'
        "# as node/round.py does\n"
        "x = 'node/round.py'  # a string in code is not prose; this comment names docs/gone.md.\n"
    )
    assert stale_paths(tmp_path) == ["bench/run.py:2: node/round.py", "bench/run.py:3: docs/gone.md"]
    (tmp_path / "node" / "core" / "state.py").rename(tmp_path / "node" / "core" / "states.py")
    assert "node/core/round.py:1: node/core/state.py" in stale_paths(tmp_path)
