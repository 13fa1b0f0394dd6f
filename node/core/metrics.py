"""One JSON object per round in DATA_DIR/metrics.jsonl, and the one-line round log.

The file is bounded however long a node runs. When it passes `MAX_METRICS_BYTES` (64 MiB,
some 45,000 rounds of 1.4 KB) it is compacted: the newest half of the cap is kept as it is,
and of the rows before it only those whose round is a multiple of a power of two, 2, 4, 8...
(the smallest that fits them in a quarter of the cap). The file is then about 3/4 of the cap.
Older rows thus stay spread over the whole run (the stride grows with it, and a row kept once
stays until the stride passes it), and every row carries the running `cumulative_reward`:
the page's curves keep their span from the first rounds, at a coarser step. Held-out rows
(`--eval-every E`) survive at the multiples of both E and the stride.

Nothing here reads the whole file into memory: a resume (`truncate_after`) and a compaction
stream it line by line into a temporary file, which is fsynced before it replaces the
original (and the directory is fsynced after), so a crash leaves the old file or the new one,
never a short one.
"""

from __future__ import annotations

import logging
import os
import shutil
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, Field
from pydantic_core import from_json

log = logging.getLogger("sapo.node")

METRICS_FILE = "metrics.jsonl"  # in the node's data dir
# Past this size the file is compacted to about 3/4 of it (see the module docstring).
MAX_METRICS_BYTES = 64 * 1024 * 1024


class RoundRecord(BaseModel):
    round: int
    time: float
    reward_mean: float = Field(description="mean reward of this round's local completions")
    cumulative_reward: float = Field(description="running sum of reward_mean (the paper's metric)")
    format_rate: float = Field(description="fraction of local completions with an <answer> tag")
    accuracy: float = Field(
        default=0.0, description="fraction of local completions with full credit (partial credit is not accuracy)"
    )
    heldout: dict[str, float] | None = Field(
        default=None, description="greedy full-credit accuracy per task on the held-out set, on --eval-every rounds"
    )
    heldout_sampled: dict[str, float] | None = Field(
        default=None,
        description="sampled pass@1 per task on the held-out set: the full-credit fraction of --eval-samples "
        "answers per question, on --eval-every rounds",
    )
    per_task: dict[str, float]
    asked: list[str] = Field(
        default_factory=list,
        description="this round's local questions, each as task#index in the node's task stream (its dataset seed "
        "is the node's --seed)",
    )
    local_groups: int
    external_groups: int
    external_planned: int = Field(default=0, description="J this round asked for (an adaptive balance moves it)")
    external_reward_mean: float | None = Field(description="this node's verifier on the external completions used")
    screened_out: int = Field(default=0, description="external groups chosen this round and refused by the screen")
    screen_redrawn: int = Field(
        default=0, description="external groups drawn again this round in place of groups the screen refused"
    )
    external_from: dict[str, int] = Field(
        default_factory=dict, description="external groups the draw chose this round, per author (before the screen)"
    )
    screened_completions: int = Field(
        default=0, description="completions the screen dropped from external groups it kept"
    )
    screen_seconds: float = Field(default=0.0, description="seconds the screen of the external groups took")
    inbox_size: int
    received: int
    accepted: int = 0
    rejected: dict[str, int]
    transport: dict[str, int] = Field(
        default_factory=dict, description="gossip-layer counters: malformed frames, drops"
    )
    published: int
    accepted_from: dict[str, int] = Field(default_factory=dict, description="verified groups per sending peer")
    peers: list[str]
    generate_seconds: float
    train_seconds: float
    round_seconds: float
    generated_tokens: int
    augment_tokens: int = Field(default=0, description="tokens generated for external questions (--augment-external)")
    update_tokens: int = Field(default=0, description="completion tokens the GRPO update trained on")
    tokens_per_second: float
    loss: float | None
    clip_fraction: float | None

    def log_line(self) -> str:
        return (
            f"round {self.round}: reward {self.reward_mean:.3f} accuracy {self.accuracy:.3f} cumulative {self.cumulative_reward:.2f} "
            f"groups {self.local_groups}+{self.external_groups} inbox {self.inbox_size} "
            f"gen {self.generate_seconds:.1f}s train {self.train_seconds:.1f}s"
        )


class MetricsLog:
    def __init__(self, path: Path, max_bytes: int = MAX_METRICS_BYTES):
        self.path = path
        self.max_bytes = max_bytes
        self._checked_end = False

    def append(self, record: RoundRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = record.model_dump_json() + "\n"
        if not self._checked_end:
            # A crash mid-write leaves a torn last line; a row appended to it would be torn too.
            self._checked_end = True
            if not _ends_with_newline(self.path):
                line = "\n" + line
        with self.path.open("a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        if size > self.max_bytes:
            try:
                self.compact()
            except (
                OSError
            ) as error:  # a full disk must not stop training: the row is written, and the next round tries again
                log.warning("could not compact %s (%s); it stays %d bytes until it can", self.path, error, size)

    def truncate_after(self, last_round: int) -> None:
        """After resuming from a checkpoint, rounds past it will be run again: drop their lines
        (and torn ones). A file over its cap (an older release's) is compacted first, so that
        the filter parses a few tens of thousands of lines, not all of them twice."""
        if not self.path.exists():
            return
        if self.path.stat().st_size > self.max_bytes:
            self.compact()

        def keep(source: BinaryIO, out: BinaryIO) -> None:
            for line in source:
                row = _row(line)
                if row is not None and row["round"] <= last_round:
                    out.write(line)

        _rewrite(self.path, keep)
        self._checked_end = True  # every line kept is whole

    def compact(self) -> None:
        """Keep the newest max_bytes/2 as it is; of the rows before it, keep those whose round is a
        multiple of the smallest power of two that fits them in max_bytes/4."""
        with self.path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - self.max_bytes // 2))
            if f.tell() > 0:
                f.readline()  # to the start of the next whole line
            newest_from = f.tell()
            if newest_from == 0:
                return  # one line longer than half the cap: nothing older to thin
            f.seek(0)
            rounds = array("q")  # each older line's round (0: torn, or none), so that the rewrite parses none
            bytes_by_zeros = [0] * 64  # bytes of the rows whose round ends in this many zero bits
            for line in _lines_before(f, newest_from):
                row = _row(line)
                n = row["round"] if row is not None and 0 < row["round"] < 1 << 62 else 0
                rounds.append(n)
                if n:
                    bytes_by_zeros[(n & -n).bit_length() - 1] += len(line)
        zeros = next(z for z in range(1, 65) if sum(bytes_by_zeros[z:]) <= self.max_bytes // 4)
        stride = 1 << zeros

        def thin(source: BinaryIO, out: BinaryIO) -> None:
            for line, n in zip(_lines_before(source, newest_from), rounds):
                if n and n % stride == 0:
                    out.write(line)
            shutil.copyfileobj(source, out)  # the newest half, as it is

        _rewrite(self.path, thin)


def _lines_before(f: BinaryIO, end: int) -> Iterator[bytes]:
    """f's lines from where it is to byte `end` (a line's start), leaving f there."""
    at = f.tell()
    if at >= end:
        return
    for line in f:
        yield line
        at += len(line)
        if at >= end:
            return


def _row(line: bytes) -> dict | None:
    """The row a line holds, or None for a torn line (a crash mid-write). pydantic's parser is
    three times as fast as json.loads, and a resume parses every line."""
    try:
        row = from_json(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("round"), int) else None


def _ends_with_newline(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return True
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"
    except FileNotFoundError:
        return True


def _rewrite(path: Path, write: Callable[[BinaryIO, BinaryIO], None]) -> None:
    """Replace `path` with what `write(old, new)` writes, durably: the new file is on disk before
    it takes the name, and the rename is on disk before this returns."""
    tmp = path.with_suffix(".jsonl.tmp")
    try:
        with path.open("rb") as source, tmp.open("wb") as out:
            write(source, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to `window` values (shorter at the start, so no curve is empty)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
