"""The experiment's own settings and config grammar: light, so `sapo-node --help` stays fast."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sapo.sampling.external_use import ExternalUse

# Node settings the experiment defaults differently from `start` (a flag given overrides them):
# one torch thread per node (they share the CPU), and quiet logs.
EXPERIMENT_NODE_DEFAULTS = ["--model", "tiny-micro", "--torch-threads", "1", "--log-level", "WARNING"]
# The CPU-scale stand-in (docs/science.md, "The testbed"), only for tiny models: easy addition
# (one-digit +, 100 questions), a warm start that always tags but gives a near miss for 60 % of
# its answers (a model that is often unsure of what it mostly knows: held-out greedy accuracy
# about 0.45 and sampled accuracy about 0.27 at the start), the rate that learned in the CPU
# prototype, and a held-out evaluation every 25 rounds. Isolation (8/0) then learns answers,
# not only the format: over 250 rounds sampled accuracy went 0.29 -> 0.51, held-out 0.47 -> 0.78.
EXPERIMENT_TINY_DEFAULTS = [
    "--tasks",
    "basic_arithmetic",
    "--task-config",
    '{"basic_arithmetic": {"operators": ["+"]}}',
    "--max-new-tokens",
    "24",
    "--warm-start-steps",
    "2000",
    "--warm-start-answer-noise",
    "0.6",
    "--warm-start-tag-rate",
    "1.0",
    "--lr",
    "3e-4",
    "--eval-every",
    "25",
    "--eval-questions",
    "50",
]
CLOCK_EPOCH = 1_700_000_000.0
MA_WINDOW = 100
METRIC_DEFINITIONS = {
    "accuracy": "per node and round: fraction of that node's local completions with full credit from the verifier",
    "reward": "per node and round: mean verifier reward of that node's local completions (partial credit included)",
    "cumulative_accuracy": "sum over rounds of a node's accuracy, averaged over the learning nodes",
    "cumulative_reward": "sum over rounds of a node's reward, averaged over the learning nodes (paper's metric)",
    "ma_curve": "trailing moving average (window: summary's ma_window, 100 unless the study is short) of the node-averaged curve",
    "peak_ma": "maximum of the MA curve; peak_round is the round at which it is reached",
    "oscillation": "mean absolute change of the MA curve between consecutive rounds after its peak",
    "final_ma": "last point of the MA curve",
    "heldout": "greedy full-credit accuracy on a fixed held-out set (the same questions for every node), mean over tasks",
    "ratio_to_baseline": "paired per seed: cumulative(config) / cumulative(T/0), T = I+J (the paper's 8/0), with a 95 % t interval",
    "ratio_to_local_only": "paired per seed: cumulative(I/J) / cumulative(I/0), matched generation compute, with a 95 % t interval",
    "generated_tokens": "tokens a node generated per round: its own questions, plus its own completions for external ones (augment)",
    "update_tokens": "completion tokens a node's update trained on per round",
    "scripted solvers": "peers only; excluded from all metrics",
}


# How an arm uses the external groups it takes, named after `+` in a config ("4/4+positive"):
# each maps to the fields of the node's one `ExternalUse` value it sets (sampling/external_use.py),
# laid over the study's own node settings for that arm. The arm table: every arm is its I/J (or
# the adaptive balance) and the ExternalUse these make of the defaults.
TREATMENTS: dict[str, dict[str, Any]] = {
    # the paper's controlled run: drop all-zero-advantage groups, sample uniformly, train on every row
    "paper": {
        "sampler": "nonzero-uniform",
        "off_policy_rows": "all",
        "external_credit": "partial",
        "augment_external": 0,
    },
    "positive": {"off_policy_rows": "positive"},  # a peer's completions train only with positive advantage
    "exact": {"external_credit": "exact"},  # a peer's completions earn 1 only for a fully correct answer
    "hascorrect": {"sampler": "has-correct"},  # only mixed groups holding a fully correct answer
    # this node adds 4 completions of its own to each external question, all-correct groups included
    "augment": {"augment_external": 4, "sampler": "any-correct"},
    # senders publish their token log-probs, and a peer's completion is weighed by the truncated
    # ratio of this node's probability of it to the sender's (same tokenizer only)
    "importance": {"share_logprobs": True, "importance_weight": "sequence"},
    # a control: the node's own completions, too, train only with positive advantage
    "ownpositive": {"own_rows": "positive"},
}
for _name, _fields in TREATMENTS.items():  # each is a valid ExternalUse, checked when the module loads
    ExternalUse(**_fields)


@dataclass(frozen=True)
class MixConfig:
    """One arm of the study: I local and J external groups per round, or an adaptive balance,
    and the treatments of its external groups."""

    name: str
    local: int
    external: int
    adaptive: bool = False
    treatments: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.local + self.external

    @property
    def mix(self) -> str:
        """The arm's I/J alone ("4/4"), without treatments; "adaptive" for the adaptive balance."""
        return "adaptive" if self.adaptive else f"{self.local}/{self.external}"

    def node_overrides(self) -> dict[str, Any]:
        """The node settings this arm sets: its I/J, its balance and its treatments (one mapping for
        the in-process nodes and the flags of libp2p node processes alike)."""
        overrides: dict[str, Any] = {
            "local": self.local,
            "external": self.external,
            "balance": "adaptive" if self.adaptive else "fixed",
        }
        for name in self.treatments:
            overrides |= TREATMENTS[name]
        return overrides

    def node_flags(self) -> list[str]:
        """The same overrides as `sapo-node start` flags, for the libp2p study's node processes."""
        flags: list[str] = []
        for name, value in self.node_overrides().items():
            option = name.replace("_", "-")
            if isinstance(value, bool):  # the node's boolean options are --x / --no-x, not --x True
                flags.append(f"--{option}" if value else f"--no-{option}")
            else:
                flags += [f"--{option}", str(value)]
        return flags


def parse_configs(specs: list[str]) -> list[MixConfig]:
    """'8/0', '4/4', ... and 'adaptive' (I+J = the largest fixed total, starting half/half), each
    optionally followed by treatments: '4/4+positive+exact' (see TREATMENTS)."""
    parsed: list[tuple[str, tuple[int, int] | None, tuple[str, ...]]] = []
    for spec in specs:
        mix, *treatments = spec.split("+")
        unknown = [t for t in treatments if t not in TREATMENTS]
        if unknown:
            raise ValueError(f"config {spec!r}: unknown treatment(s) {unknown}; choose from {', '.join(TREATMENTS)}")
        if mix == "adaptive":
            parsed.append((spec, None, tuple(treatments)))
            continue
        local, sep, external = mix.partition("/")
        if not sep or not local.isdigit() or not external.isdigit() or int(local) + int(external) == 0:
            raise ValueError(f"config {spec!r} is not I/J (like 4/4) or 'adaptive', with optional +treatments")
        parsed.append((spec, (int(local), int(external)), tuple(treatments)))
    total = max((sum(split) for _, split, _ in parsed if split), default=8)
    return [
        MixConfig(spec, *(split or (total - total // 2, total // 2)), adaptive=split is None, treatments=treatments)
        for spec, split, treatments in parsed
    ]


class ExperimentSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: int = Field(default=8, ge=1, le=64, description="learning nodes per run")
    configs: list[str] = Field(
        default_factory=lambda: ["8/0", "6/2", "4/4", "2/6"],
        description="I/J arms, comma-separated; 'adaptive' lets each node move its own I/J (I+J fixed); "
        f"+treatment after an arm sets how it uses external groups ({', '.join(TREATMENTS)}), e.g. 4/4+positive",
    )
    rounds: int = Field(default=100, ge=1, le=100_000, description="rounds per run")
    seeds: int = Field(
        default=1,
        ge=1,
        le=100,
        description="runs per config, seeds 0..N-1 (node k of seed s gets node seed --seed + 1000s + k)",
    )
    out: Path = Field(default=Path("sapo-experiment"), description="output directory")
    specialists: Literal["none", "tasks", "questions"] = Field(
        default="none",
        description="disjoint knowledge: node k warm-starts only on its share of --tasks (tasks: needs >= 2) or "
        "of the questions (questions: 1/N of them, by a hash of the question); every node is then asked everything",
    )
    slices: list[dict[str, Any]] = Field(
        default_factory=list,
        description="specialists by what they train on: node k asks only slice k mod S of the one --tasks task, each "
        'slice a JSON config laid over its --task-config (e.g. [{"operators": ["+"]}, {"operators": ["-"]}]); every '
        "node's held-out set is --eval-questions of each slice",
    )
    mixed_sizes: bool = Field(default=False, description="node models cycle tiny-micro, tiny-small, tiny")
    mixed_tokenizers: bool = Field(default=False, description="node models alternate tiny (char) and tiny-bpe")
    scripted_solvers: int = Field(default=0, ge=0, le=64, description="extra generate-only peers that answer by script")
    solver_accuracy: float = Field(
        default=0.5, ge=0, le=1, description="probability a scripted solver's answer is correct"
    )
    format_discovery: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="warm-start tag rate for all nodes below 1, so the <answer> format must be discovered (default: the "
        "node setting --warm-start-tag-rate)",
    )
    late_joiners: int = Field(
        default=0,
        ge=0,
        le=63,
        description="the last K learning nodes of each run join at --join-round: before it they neither generate, "
        "publish nor receive, and then start from the warm start like the others did",
    )
    join_round: int | None = Field(
        default=None,
        ge=2,
        le=100_000,
        description="the round late joiners start at (default: half the rounds, plus one)",
    )
    shared_base: bool = Field(
        default=False,
        description="the learners of a run are LoRA adapters (needs --lora) of one base model in memory, and their "
        "round's generation is one mixed batch through it",
    )
    round_seconds: float = Field(
        default=1000.0, gt=0, description="simulated seconds per round (inbox ages use this clock)"
    )
    ma_window: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="moving-average window of the curves and peak/oscillation metrics (default: 100, the paper's, "
        "or a third of the rounds if that is shorter)",
    )
    resummarize: Path | None = Field(
        default=None, description="recompute the outputs of the study in this directory from its raw.jsonl, and exit"
    )
    transport: Literal["memory", "libp2p"] = Field(
        default="memory",
        description="memory: lockstep rounds in one process; libp2p: each run is a real `sapo-node swarm` of node "
        "processes on 127.0.0.1 (a fidelity check; homogeneous fixed I/J only)",
    )
    max_minutes: float | None = Field(
        default=None,
        gt=0,
        description="stop starting rounds after this long; configs are compared over the rounds all completed",
    )
    run_checkpoint_every: int = Field(
        default=10,
        ge=0,
        le=100_000,
        description="each run checkpoints itself (its nodes, inboxes, peers and records) every N rounds and when "
        "stopped (Ctrl-C, SIGTERM, --max-minutes), so that the same command with the same --out continues "
        "where it stopped; 0: never (a stopped run starts over)",
    )
    jobs: int | None = Field(
        default=None, ge=1, le=256, description="runs in parallel, one process each (default: one per CPU core)"
    )
    progress: bool = Field(default=True, description="progress bar on stderr")

    @field_validator("specialists", mode="before")
    @classmethod
    def _specialists_flag(cls, value: Any) -> Any:
        # `--specialists` alone (and studies recorded before there were two kinds) mean by task
        return {True: "tasks", False: "none", "true": "tasks", "false": "none"}.get(value, value)

    @field_validator("slices", mode="before")
    @classmethod
    def _slices_json(cls, value: Any) -> Any:
        if isinstance(value, str):  # the flag's JSON
            try:
                return json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(f"--slices is not JSON: {error}") from None
        return value

    @field_validator("configs", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            value = [part.strip() for item in value for part in str(item).split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _check(self) -> ExperimentSettings:
        parse_configs(self.configs)
        if len(set(self.configs)) != len(self.configs):
            raise ValueError(f"configs repeat: {self.configs}")
        if self.transport == "libp2p":
            unsupported = [name for name in ("mixed_sizes", "mixed_tokenizers") if getattr(self, name)]
            unsupported += ["specialists"] if self.specialists != "none" else []
            unsupported += ["scripted_solvers"] if self.scripted_solvers else []
            unsupported += ["adaptive"] if "adaptive" in self.configs else []
            if unsupported:
                raise ValueError(
                    f"--transport libp2p runs homogeneous fixed-I/J studies; drop {', '.join(unsupported)} "
                    "or use the in-memory transport"
                )
        if self.slices:
            conflicting = ["specialists"] if self.specialists != "none" else []
            conflicting += ["transport libp2p"] if self.transport == "libp2p" else []
            if conflicting:
                raise ValueError(f"--slices makes its own specialists; drop {', '.join(conflicting)}")
            if len(self.slices) < 2:
                raise ValueError("--slices needs at least two slices to split among the nodes")
        if self.mixed_sizes and self.mixed_tokenizers:
            raise ValueError("choose one of --mixed-sizes and --mixed-tokenizers")
        if self.shared_base:
            conflicting = [name for name in ("mixed_sizes", "mixed_tokenizers") if getattr(self, name)]
            conflicting += ["specialists"] if self.specialists != "none" else []
            conflicting += ["transport libp2p"] if self.transport == "libp2p" else []
            if conflicting:
                raise ValueError(f"--shared-base puts every learner on one base model; drop {', '.join(conflicting)}")
        if self.late_joiners:
            if self.late_joiners >= self.nodes:
                raise ValueError(
                    f"--late-joiners {self.late_joiners} leaves no node to start the run with --nodes "
                    f"{self.nodes}; use fewer than --nodes"
                )
            if self.transport == "libp2p":
                raise ValueError("--late-joiners needs the in-memory transport's round clock; drop --transport libp2p")
            if self.first_late_round > self.rounds:
                raise ValueError(
                    f"--join-round {self.first_late_round} is after the last round ({self.rounds}); "
                    "late joiners would never run"
                )
        elif self.join_round is not None:
            raise ValueError("--join-round needs --late-joiners K")
        return self

    @property
    def questions_per_round(self) -> int:
        """What each node draws a round: the largest I+J of the arms, so that an arm with I local
        questions asks the first I of the same list as every other arm (matched questions)."""
        return max(config.total for config in parse_configs(self.configs))

    @property
    def first_late_round(self) -> int:
        return self.join_round if self.join_round is not None else self.rounds // 2 + 1

    def joins_at(self, index: int) -> int:
        """The round node `index` of a run starts at: 1, or the join round for the last
        `late_joiners` nodes."""
        return self.first_late_round if index >= self.nodes - self.late_joiners else 1
