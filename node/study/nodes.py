"""Who takes part in one run of the study: the learning nodes (the daemon's own `Node`), the
scripted solvers, their in-memory lockstep hub and the round clock."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapo.node.core.counters import NodeCounters
from sapo.node.core.memory_exchange import MemoryExchange, MemoryHub
from sapo.node.core.metrics import METRICS_FILE
from sapo.node.core.node import Node
from sapo.node.core.round import Generate, generate_alone
from sapo.node.core.settings import NodeSettings
from sapo.node.core.state import NodeState
from sapo.node.study.settings import CLOCK_EPOCH, ExperimentSettings, MixConfig
from sapo.training.scripted import ScriptedSolver
from sapo.training.tasks import TaskSampler, TaskSpec, reasoning_gym_version

SIZE_CYCLE = ("tiny-micro", "tiny-small", "tiny")  # 0.13M, 0.45M, 1M: 8x apart, all CPU-friendly
TOKENIZER_CYCLE = ("tiny", "tiny-bpe")


def peer_id_for(seed: int, index: int, role: str = "node") -> str:
    """A stable base58 id shaped like a libp2p peer id (the wire checks the alphabet)."""
    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
    digest = hashlib.sha256(f"{role}-{seed}-{index}".encode()).digest()
    return "12D3KooW" + "".join(alphabet[b % 58] for b in digest[:44])


def node_model(base: NodeSettings, study: ExperimentSettings, index: int) -> str:
    if study.mixed_sizes:
        return SIZE_CYCLE[index % len(SIZE_CYCLE)]
    if study.mixed_tokenizers:
        return TOKENIZER_CYCLE[index % len(TOKENIZER_CYCLE)]
    return base.model.model


def specialist_tasks(tasks: list[TaskSpec], nodes: int, index: int) -> list[TaskSpec]:
    if len(tasks) < 2:
        raise ValueError("--specialists needs at least two --tasks to split among the nodes")
    shares = min(len(tasks), nodes)
    return [t for i, t in enumerate(tasks) if i % shares == index % shares]


def node_settings(
    base: NodeSettings, study: ExperimentSettings, config: MixConfig, seed: int, index: int, run_dir: Path
) -> NodeSettings:
    """Node k of a run: the study's node settings, this arm's I/J and treatments, its own data
    dir and seed; it never checkpoints (its results are its round records)."""
    values: dict[str, Any] = {
        "model": node_model(base, study, index),
        "models_dir": base.model.models_dir or study.out / "models",
        "data_dir": run_dir / f"node-{index}",
        "seed": base.run.seed + 1000 * seed + index,
        "checkpoint_every": 0,
        "swarm": "experiment",
        **config.node_overrides(),
    }
    if study.format_discovery is not None:
        values["warm_start_tag_rate"] = study.format_discovery
    if study.specialists == "questions":
        values["warm_start_share"] = f"{index}/{study.nodes}"
    return base.updated(values)


class RecordsInMemory:
    """Where a study's node keeps its round records (a `RoundLog`): no fsync per node-round;
    written once at the end."""

    def __init__(self, path: Path):
        self.path = path
        self.records: list = []

    def append(self, record) -> None:
        self.records.append(record)

    def truncate_after(self, round_index: int) -> None:
        self.records = [r for r in self.records if r.round <= round_index]

    def flush(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(r.model_dump_json() + "\n" for r in self.records))


@dataclass
class Learner:
    index: int
    node: Node
    exchange: MemoryExchange
    state: NodeState  # after its last round; each round hands it a new one
    records: RecordsInMemory  # its node's round records
    joins_at: int = 1  # its first round (a late joiner's is later)


@dataclass
class ScriptedPeer:
    index: int
    solver: ScriptedSolver
    tasks: TaskSampler
    exchange: MemoryExchange
    generations: int
    local: int

    async def round(self, round_index: int) -> None:
        """A scripted peer's round: answer its questions and publish; it never trains."""
        generation = self.solver.generate_groups(self.tasks.sample(self.local), self.generations, round_index)
        await self.exchange.publish(generation.groups, round_index)


@dataclass
class StudyRun:
    """The members of one config x seed run, sharing one lockstep hub and one round clock, and
    how their rounds generate (each alone, or one batch on a shared base)."""

    clock: RoundClock
    hub: MemoryHub
    learners: list[Learner]
    solvers: list[ScriptedPeer]
    generate: Generate = generate_alone


class RoundClock:
    def __init__(self, round_seconds: float):
        self.round_seconds = round_seconds
        self.round = 0

    def __call__(self) -> float:
        return CLOCK_EPOCH + self.round * self.round_seconds


def build_run(base: NodeSettings, study: ExperimentSettings, config: MixConfig, seed: int, run_dir: Path) -> StudyRun:
    clock = RoundClock(study.round_seconds)
    hub = MemoryHub(clock, rg_version=reasoning_gym_version(), lockstep=True)
    learners = []
    every = [node_settings(base, study, config, seed, k, run_dir) for k in range(study.nodes)]
    shared = shared_base(every) if study.shared_base else None
    for k, settings in enumerate(every):
        tasks = specialist_tasks(settings.tasks.specs(), study.nodes, k) if study.specialists == "tasks" else None
        policy = shared.policy(k) if shared is not None else None
        records = RecordsInMemory(settings.run.data_dir / METRICS_FILE)
        node = Node(settings, peer_id=peer_id_for(seed, k), warm_start_tasks=tasks, policy=policy, metrics=records)
        receives = config.adaptive or config.external > 0
        exchange = hub.join(
            node.peer_id,
            settings,
            inbox=node.inbox if receives else None,
            counters=node.counters,
            verifier=node.verifier,
            joins_at=study.joins_at(k),
        )
        # a late joiner's rounds are numbered from its join round, like everyone's in that round
        state = node.start_state().model_copy(update={"round": study.joins_at(k) - 1})
        learners.append(Learner(k, node, exchange, state, records, study.joins_at(k)))
    solvers = []
    for k in range(study.scripted_solvers):
        peer_seed = base.run.seed + 1000 * seed + 500 + k
        exchange = hub.join(
            peer_id_for(seed, k, "solver"), every[0], inbox=None, counters=NodeCounters(), model_id="scripted"
        )
        solvers.append(
            ScriptedPeer(
                k,
                ScriptedSolver(study.solver_accuracy, seed=peer_seed),
                TaskSampler(base.tasks.specs(), dataset_seed=peer_seed, rng_seed=peer_seed),
                exchange,
                base.training.generations,
                config.local,
            )
        )
    if shared is None:
        return StudyRun(clock, hub, learners, solvers)
    from sapo.node.study.shared_generation import BatchedGeneration

    batch = BatchedGeneration(lambda r: sum(1 for learner in learners if learner.joins_at <= r))
    return StudyRun(clock, hub, learners, solvers, batch.generate)


def shared_base(every: list[NodeSettings]):
    """The run's one base model with one LoRA adapter per learner (--shared-base)."""
    from sapo.training.policy import LoraOptions
    from sapo.training.shared_base import SharedLoraBase

    m = every[0].model
    return SharedLoraBase(
        m.model,
        len(every),
        lora=LoraOptions(rank=m.lora_rank, alpha=2 * m.lora_rank),
        seeds=[s.run.seed for s in every],
        models_dir=m.models_dir or every[0].run.data_dir / "models",
        device=m.device,
        prompt_style=m.prompt_style,
        one_shot=m.one_shot,
        precision=m.precision,
        generation_precision=m.generation_precision,
    )
