"""The repository's own files: what git keeps (tracked, or new and not ignored). Hidden folders,
virtual environments (bench/peers/ holds three) and build leftovers (a non-editable install's
build/lib/ copies of our READMEs and modules) are not the project's, and git ignores them."""

from __future__ import annotations

import subprocess
from pathlib import Path


def files_git_keeps(root: Path, pattern: str) -> list[Path]:
    """The files under `root` matching `pattern` (a git pathspec such as "*.md") that git keeps."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", pattern],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted(root / name for name in set(listed.split("\0")) if name and (root / name).exists())
