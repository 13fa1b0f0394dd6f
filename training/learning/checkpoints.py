"""Atomic, verifiable checkpoints under DATA_DIR/checkpoints/.

Each checkpoint is a directory `round-NNNNNNNN/` holding the model in HF format (`model/`),
the optimizer's state (`trainer.pt`), the node's state (`state.json`) and a manifest of
every file's size and SHA-256, written last. It is built in a `.partial-*` directory, fsynced,
then renamed into place, so a crash at any point leaves either the old set or the new one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger("sapo.checkpoints")

MANIFEST = "MANIFEST.json"
MEMORY_FILE = "memory.json"  # the node's memory of its peers (node/core/memory.py)
PREFIX = "round-"
PARTIAL_PREFIX = ".partial-"


class CheckpointError(RuntimeError):
    pass


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    round: int

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    def state(self) -> dict[str, Any]:
        return json.loads((self.path / "state.json").read_text())

    def memory(self) -> dict[str, Any] | None:
        """The node's memory of its peers, saved with this checkpoint (None in one from before
        nodes saved it)."""
        path = self.path / MEMORY_FILE
        return json.loads(path.read_text()) if path.is_file() else None

    def trainer_state(self) -> dict[str, Any]:
        import torch

        return torch.load(self.path / "trainer.pt", map_location="cpu", weights_only=False)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    for directory in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    root: Path,
    round_index: int,
    write_model: Callable[[Path], None],
    trainer_state: dict[str, Any],
    state: dict[str, Any],
    keep: int = 3,
    memory: dict[str, Any] | None = None,
) -> Checkpoint:
    """Write a checkpoint atomically and keep the newest `keep` ones; `memory` (the node's memory
    of its peers, node/core/memory.py) goes in a file of its own, compact: it can be megabytes."""
    import torch

    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create checkpoint directory {root}: {exc.strerror}") from exc
    final = root / f"{PREFIX}{round_index:08d}"
    partial = root / f"{PARTIAL_PREFIX}{PREFIX}{round_index:08d}-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir()
        write_model(partial / "model")
        torch.save(trainer_state, partial / "trainer.pt")
        (partial / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
        if memory is not None:
            with (partial / MEMORY_FILE).open("w", encoding="utf-8") as out:
                write_json_in_pieces(memory, out)
        files = {
            str(p.relative_to(partial)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(partial.rglob("*"))
            if p.is_file()
        }
        (partial / MANIFEST).write_text(json.dumps({"round": round_index, "files": files}, indent=1))
        _fsync_tree(partial)
        if final.exists():
            remove_checkpoint(final)
        os.rename(partial, final)
        _fsync_dir(root)
    except Exception as exc:  # not only OSError: safetensors reports a full disk as SafetensorError
        shutil.rmtree(partial, ignore_errors=True)
        reason = getattr(exc, "strerror", None) or str(exc)
        raise CheckpointError(
            f"could not write checkpoint {final}: {reason}; the previous checkpoints are intact. "
            "Free disk space or fix the data directory's permissions."
        ) from exc
    _prune(root, keep)
    return Checkpoint(final, round_index)


def write_json_in_pieces(value: Any, out: TextIO, depth: int = 3) -> None:
    """`value` as compact JSON, its dicts and lists opened `depth` levels down and each piece
    below dumped alone. One `json.dumps` of a node's whole memory is one C call that holds the
    GIL for as long as it runs (seconds for a full inbox), freezing the trio loop; pieces let it
    breathe between them. The same text as one dumps, but for the pieces' order of writing."""
    if depth == 0 or not isinstance(value, (dict, list)) or not value:
        out.write(json.dumps(value, separators=(",", ":"), ensure_ascii=False))
        return
    items = value.items() if isinstance(value, dict) else enumerate(value)
    out.write("{" if isinstance(value, dict) else "[")
    for position, (key, item) in enumerate(items):
        if position:
            out.write(",")
        if isinstance(value, dict):
            out.write(json.dumps(str(key), ensure_ascii=False) + ":")
        write_json_in_pieces(item, out, depth - 1)
    out.write("}" if isinstance(value, dict) else "]")


def _prune(root: Path, keep: int) -> None:
    for old in _round_dirs(root)[keep:]:
        remove_checkpoint(old)


def remove_checkpoint(checkpoint: Path) -> None:
    """Delete a checkpoint so that a crash part-way leaves a partial (cleared at the next start),
    never a checkpoint with its manifest but not all its files: rmtree goes file by file."""
    doomed = checkpoint.with_name(f"{PARTIAL_PREFIX}{checkpoint.name}-removed-{os.getpid()}")
    try:
        os.rename(checkpoint, doomed)
    except OSError:
        return  # gone already, or not ours to remove: the next prune tries again
    shutil.rmtree(doomed, ignore_errors=True)


def _round_dirs(root: Path) -> list[Path]:
    """Checkpoint directories, newest first."""
    if not root.is_dir():
        return []
    dirs = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit()]
    return sorted(dirs, key=lambda p: int(p.name[len(PREFIX) :]), reverse=True)


def verify_checkpoint(path: Path) -> Checkpoint:
    """Check every file against the manifest; raise CheckpointError naming the bad file."""
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
        round_index = int(manifest["round"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {path} is incomplete or corrupt: unreadable {manifest_path}") from exc
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is corrupt: missing {file}")
        if file.stat().st_size != expected["bytes"] or _sha256(file) != expected["sha256"]:
            raise CheckpointError(f"checkpoint {path} is corrupt: {file} does not match its manifest")
    return Checkpoint(path, round_index)


def clear_partials(root: Path) -> None:
    """Leftovers of a write interrupted by a crash are never valid checkpoints."""
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(PARTIAL_PREFIX):
                shutil.rmtree(p, ignore_errors=True)


def latest_checkpoint(root: Path) -> Checkpoint | None:
    """The newest checkpoint that verifies. Falls back past corrupt ones, loudly; if there are
    checkpoints but none verifies, raises rather than silently starting over."""
    clear_partials(root)
    errors = []
    for path in _round_dirs(root):
        try:
            checkpoint = verify_checkpoint(path)
        except CheckpointError as exc:
            log.error("%s; falling back to an older checkpoint", exc)
            errors.append(str(exc))
            continue
        if errors:
            log.warning("resuming from %s, older than the corrupt one(s) above", path)
        return checkpoint
    if errors:
        raise CheckpointError(
            "no usable checkpoint: " + "; ".join(errors) + ". Move the checkpoints directory aside to start over."
        )
    return None
