"""Earlier releases of sapo, installed from this repository's own history, for the upgrade tests.

CHANGELOG.md names each release's commit. `release_python("0.1.0")` checks that commit out with
`git worktree add` into a temporary directory, installs it into its own venv (pip: PyPI, and the
local find-links for torch) and removes the worktree again. The venv is kept in
$SAPO_RELEASES_CACHE (default ~/.cache/sapo/releases/<version>-<commit>), so only the first run
pays the ~3 minutes. Without the commit (a shallow clone) the test is skipped, saying why, unless
SAPO_REQUIRE_RELEASES is set (CI), when it fails.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHANGELOG = ROOT / "CHANGELOG.md"
# "## 0.1.0: commit 36e7e26, 2026-12-01"
RELEASE = re.compile(r"^## (\d+\.\d+\.\d+)\b.*?\bcommit ([0-9a-f]{7,40})\b", re.MULTILINE)
INSTALL_TIMEOUT_SECONDS = 1200


def released() -> dict[str, str]:
    """Every release CHANGELOG.md names with its commit: version -> commit."""
    return dict(RELEASE.findall(CHANGELOG.read_text()))


def cache_dir() -> Path:
    return Path(os.environ.get("SAPO_RELEASES_CACHE", Path.home() / ".cache" / "sapo" / "releases"))


def release_python(version: str) -> Path:
    """The Python of a venv holding release `version`, installed on first use; skips the test
    when this clone lacks the release's commit."""
    commit = released().get(version)
    assert commit, f"CHANGELOG.md names no commit for release {version}"
    venv = cache_dir() / f"{version}-{commit}"
    python = venv / "bin" / "python"
    done = venv / ".installed"
    if done.exists():
        return python
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        why = (
            f"release {version} (commit {commit}) is not in this clone's history (a shallow clone?): "
            f"`git fetch --unshallow` to run the upgrade tests"
        )
        assert not os.environ.get("SAPO_REQUIRE_RELEASES"), why  # CI insists
        pytest.skip(why)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be installing it right now
        if not done.exists():
            _install(commit, venv)
            done.touch()
    return python


def _install(commit: str, venv: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="sapo-release-") as tmp:
        source = Path(tmp) / "src"
        added = _git("worktree", "add", "--detach", str(source), commit)
        assert added.returncode == 0, added.stderr
        try:
            for command in (
                [sys.executable, "-m", "venv", "--clear", str(venv)],
                [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(source)],
            ):
                run = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS)
                assert run.returncode == 0, f"{' '.join(command)} failed:\n{run.stderr[-3000:]}"
        finally:
            _git("worktree", "remove", "--force", str(source))


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
