"""One JSON object per round in DATA_DIR/metrics.jsonl, and the one-line round log."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, Field

METRICS_FILE = "metrics.jsonl"  # in the node's data dir


class RoundRecord(BaseModel):
    round: int
    time: float
    reward_mean: float = Field(description="mean reward of this round's local completions")
    cumulative_reward: float = Field(description="running sum of reward_mean (the paper's metric)")
    format_rate: float = Field(description="fraction of local completions with an <answer> tag")
    accuracy: float = Field(default=0.0, description="fraction of local completions with full credit (partial credit is not accuracy)")
    heldout: dict[str, float] | None = Field(
        default=None, description="greedy full-credit accuracy per task on the held-out set, on --eval-every rounds"
    )
    per_task: dict[str, float]
    local_groups: int
    external_groups: int
    external_planned: int = Field(default=0, description="J this round asked for (an adaptive balance moves it)")
    external_reward_mean: float | None = Field(description="this node's verifier on the external completions used")
    screened_out: int = Field(default=0, description="external groups chosen this round and refused by the screen")
    inbox_size: int
    received: int
    accepted: int = 0
    rejected: dict[str, int]
    transport: dict[str, int] = Field(default_factory=dict, description="gossip-layer counters: malformed frames, drops")
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
    def __init__(self, path: Path):
        self.path = path

    def append(self, record: RoundRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(record.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        rows = []
        for line in self.path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line from a crash mid-write
        return rows

    def truncate_after(self, last_round: int) -> None:
        """After resuming from a checkpoint, rounds past it will be run again: drop their lines."""
        rows = [r for r in self.read() if r.get("round", 0) <= last_round]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, self.path)
