"""Who takes part in one run of the study: the learning nodes (the daemon's own `Node`), the
scripted solvers, their in-memory lockstep hub and the round clock; and the run's checkpoint,
all of them at one round (`StudyRun.checkpoint`; `build_run` then `StudyRun.restore` resume it)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sapo.node.core.counters import NodeCounters
from sapo.node.core.memory_exchange import MemoryExchange, MemoryHub
from sapo.node.core.metrics import METRICS_FILE, RoundRecord
from sapo.node.core.node import Node
from sapo.node.core.round import Generate, generate_alone
from sapo.node.core.settings import NodeSettings
from sapo.node.core.state import NodeState, RngState, TaskCursor
from sapo.node.study.settings import CLOCK_EPOCH, ExperimentSettings, MixConfig
from sapo.training.completions.evaluation import heldout_problems
from sapo.training.completions.scripted import ScriptedSolver
from sapo.training.learning.checkpoints import PREFIX, Checkpoint, latest_checkpoint, remove_checkpoint
from sapo.training.problems.tasks import Problem, TaskSampler, TaskSpec, question_stream, reasoning_gym_version

RUN_STATE = "run-state.json"  # in the run's dir: the round its checkpoint is at, and all but the nodes' own
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


def base_seed(base: NodeSettings) -> int:
    """Where a study's node seeds count from: --seed, or 0. Not the identity's, as a daemon's is:
    a study's run must repeat exactly, and each of its nodes is given a seed of its own."""
    return base.run.seed if base.run.seed is not None else 0


def node_settings(
    base: NodeSettings, study: ExperimentSettings, config: MixConfig, seed: int, index: int, run_dir: Path
) -> NodeSettings:
    """Node k of a run: the study's node settings, this arm's I/J and treatments, its own data
    dir and seed; it never checkpoints on its own: the run checkpoints all its nodes at once, and
    keeps two of each so that one is at the round of the run's last complete checkpoint."""
    values: dict[str, Any] = {
        "model": node_model(base, study, index),
        "models_dir": base.model.models_dir or study.out / "models",
        "data_dir": run_dir / f"node-{index}",
        "seed": base_seed(base) + 1000 * seed + index,
        "checkpoint_every": 0,
        "keep_checkpoints": 2,
        "swarm": "experiment",
        "draw_questions": study.questions_per_round,
        **config.node_overrides(),
    }
    if study.slices:
        values["task_config"] = {task.name: task.config for task in slice_tasks(base, study)[index % len(study.slices)]}
    if study.format_discovery is not None:
        values["warm_start_tag_rate"] = study.format_discovery
    if study.specialists == "questions":
        values["warm_start_share"] = f"{index}/{study.nodes}"
    return base.updated(values)


def slice_tasks(base: NodeSettings, study: ExperimentSettings) -> list[list[TaskSpec]]:
    """--slices: each slice's task list, the one task with the slice's config laid over its own."""
    (task,) = base.tasks.specs()
    return [[task.model_copy(update={"config": task.config | part})] for part in study.slices]


def slice_heldout(base: NodeSettings, study: ExperimentSettings) -> dict[str, list[Problem]]:
    """--slices: every node's held-out set, --eval-questions of each slice, keyed by the slice."""
    heldout: dict[str, list[Problem]] = {}
    for part, (task,) in zip(study.slices, slice_tasks(base, study)):
        label = f"{task.name} {json.dumps(part, sort_keys=True, separators=(',', ':'))}"
        heldout[label] = heldout_problems([task], base.run.eval_questions)[task.name]
    return heldout


class RecordsInMemory:
    """Where a study's node keeps its round records (a `RoundLog`): no fsync per node-round;
    written at the run's checkpoints and at its end, and read back when it resumes."""

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

    def load_through(self, round_index: int) -> None:
        """The records flushed before, up to `round_index` (a run resuming from there)."""
        lines = self.path.read_text().splitlines() if self.path.is_file() else []
        self.records = [RoundRecord.model_validate_json(line) for line in lines]
        self.truncate_after(round_index)


@dataclass
class Learner:
    index: int
    node: Node
    exchange: MemoryExchange
    state: NodeState  # after its last round; each round hands it a new one
    records: RecordsInMemory  # its node's round records
    joins_at: int = 1  # its first round (a late joiner's is later)

    def to_json(self) -> dict[str, Any]:
        """What a run's checkpoint keeps of it besides its node's own checkpoint (which holds its
        `NodeState` and its memory of its peers, as the daemon's does)."""
        return {"index": self.index}

    def restore(self, saved: dict[str, Any]) -> None:
        """Its round records up to the node's round (its node restored the rest from its checkpoint)."""
        if "inbox" in saved and not self.node.memory_restored:
            # a run checkpointed before nodes saved their memory kept it here (sapo 0.4.0's studies)
            self.node.inbox.restore(saved["inbox"])
            if saved["intake"] is not None:
                self.node.memory.intake.restore(saved["intake"])
            self.node.counters.restore(saved["counters"])
        self.records.load_through(self.state.round)


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

    def to_json(self) -> dict[str, Any]:
        """Where its random streams got to, and what it counted."""
        return ScriptedPeerState(
            answers=self.solver.rng.getstate(), tasks=TaskCursor.model_validate(self.tasks.state_dict())
        ).model_dump(mode="json") | {"counters": self.exchange.member.counters.to_json()}

    def restore(self, saved: dict[str, Any]) -> None:
        state = ScriptedPeerState.model_validate(saved)
        self.solver.rng.setstate(state.answers)
        self.tasks.load_state_dict(state.tasks.model_dump())
        self.exchange.member.counters.restore(saved["counters"])


class ScriptedPeerState(BaseModel):
    answers: RngState  # the solver's stream: right or wrong, and which near miss
    tasks: TaskCursor  # its task stream


@dataclass
class StudyRun:
    """The members of one config x seed run, sharing one lockstep hub and one round clock, and
    how their rounds generate (each alone, or one batch on a shared base)."""

    clock: RoundClock
    hub: MemoryHub
    learners: list[Learner]
    solvers: list[ScriptedPeer]
    generate: Generate = generate_alone

    def checkpoint(self, run_dir: Path, timing: dict[str, Any] | None = None) -> None:
        """Everything later rounds depend on, as of the last round (`clock.round`): each learner's
        node checkpoint (weights or adapter, optimizer, `NodeState`) and round records, then, last
        and atomically, RUN_STATE: each learner's inbox (with its authors' standing), intake
        memories and counters, the scripted peers' streams, and what the run's rounds cost so far
        (`timing`: a resumed run adds to it). A crash at any point leaves the
        previous checkpoint whole: the nodes keep two, and RUN_STATE names the round to resume.

        Between rounds the lockstep hub holds nothing (every round delivers what it got) and the
        clock is the round; a shared base's batch holds nothing either."""
        round_index = self.clock.round
        if not self.hub.idle():
            raise RuntimeError("a run checkpoints between rounds, when its hub has delivered everything")
        joined = [learner for learner in self.learners if learner.joins_at <= round_index]
        for learner in joined:
            learner.node.checkpoint(learner.state)  # a late joiner not yet in starts as built
            learner.records.flush()
        state = {
            "round": round_index,
            "learners": [learner.to_json() for learner in joined],
            "solvers": [peer.to_json() for peer in self.solvers],
            "timing": timing or {},  # what the rounds so far cost: a resumed run adds to it
        }
        partial = run_dir / f".{RUN_STATE}.partial"
        with partial.open("w") as file:
            file.write(json.dumps(state))
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, run_dir / RUN_STATE)

    def restore(self, saved: dict[str, Any]) -> None:
        """Take RUN_STATE back into a run just built from the same settings, whose nodes resumed
        from their checkpoints at its round (`build_run` finds them in the run's dir)."""
        round_index = saved["round"]
        self.clock.round = round_index
        by_index = {learner.index: learner for learner in self.learners}
        for entry in saved["learners"]:
            learner = by_index[entry["index"]]
            if learner.state.round != round_index:
                raise RuntimeError(
                    f"node {learner.index} resumed at round {learner.state.round}, the run's checkpoint is at "
                    f"round {round_index}: its checkpoints in {learner.node.checkpoints_dir} are missing or "
                    "corrupt; delete the run's directory to run it again"
                )
            learner.restore(entry)
        for peer, state in zip(self.solvers, saved["solvers"], strict=True):
            peer.restore(state)


def read_run_state(run_dir: Path) -> dict[str, Any] | None:
    """The run's last checkpoint's RUN_STATE, or None if it has none; the nodes' checkpoints after
    its round (written before a crash, before RUN_STATE) are removed so that theirs is the latest."""
    path = run_dir / RUN_STATE
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    for node_dir in run_dir.glob("node-*"):
        for checkpoint in (node_dir / "checkpoints").glob(f"{PREFIX}*"):
            if checkpoint.name[len(PREFIX) :].isdigit() and int(checkpoint.name[len(PREFIX) :]) > saved["round"]:
                remove_checkpoint(checkpoint)
    return saved


def remove_run_checkpoint(run_dir: Path) -> None:
    """A finished run needs its checkpoints no more (a real model's are gigabytes a node)."""
    (run_dir / RUN_STATE).unlink(missing_ok=True)
    for node_dir in run_dir.glob("node-*"):
        shutil.rmtree(node_dir / "checkpoints", ignore_errors=True)


class RoundClock:
    def __init__(self, round_seconds: float):
        self.round_seconds = round_seconds
        self.round = 0

    def __call__(self) -> float:
        return CLOCK_EPOCH + self.round * self.round_seconds


def build_run(base: NodeSettings, study: ExperimentSettings, config: MixConfig, seed: int, run_dir: Path) -> StudyRun:
    """The run's members, each node resumed from its checkpoint in `run_dir` if it has one (then
    `StudyRun.restore` brings back the rest of the run's checkpoint)."""
    clock = RoundClock(study.round_seconds)
    hub = MemoryHub(clock, rg_version=reasoning_gym_version(), lockstep=True)
    learners = []
    every = [node_settings(base, study, config, seed, k, run_dir) for k in range(study.nodes)]
    # nodes on a shared base are handed their policy: its adapters load from their checkpoints here
    resumed = [latest_checkpoint(s.run.data_dir / "checkpoints") if study.shared_base else None for s in every]
    shared = shared_base(every, resumed) if study.shared_base else None
    heldout = slice_heldout(base, study) if study.slices and base.run.eval_every else None
    for k, settings in enumerate(every):
        tasks = specialist_tasks(settings.tasks.specs(), study.nodes, k) if study.specialists == "tasks" else None
        policy = shared.policy(k) if shared is not None else None
        records = RecordsInMemory(settings.run.data_dir / METRICS_FILE)
        node = Node(
            settings,
            peer_id=peer_id_for(seed, k),
            warm_start_tasks=tasks,
            policy=policy,
            metrics=records,
            checkpoint=resumed[k],
            fresh_completions_on_resume=False,  # its peers resume with it: the run goes on as if never stopped
        )
        if heldout is not None:  # a slice's specialist is asked every slice
            node.heldout = heldout
        receives = config.adaptive or config.external > 0
        exchange = hub.join(
            node.peer_id,
            settings,
            memory=node.memory if receives else None,
            counters=node.counters,
            joins_at=study.joins_at(k),
        )
        # a late joiner's rounds are numbered from its join round, like everyone's in that round
        state = node.start_state()
        if node.resumed_from is None:
            state = state.model_copy(update={"round": study.joins_at(k) - 1})
        learners.append(Learner(k, node, exchange, state, records, study.joins_at(k)))
    solvers = []
    for k in range(study.scripted_solvers):
        peer_seed = base_seed(base) + 1000 * seed + 500 + k
        exchange = hub.join(
            peer_id_for(seed, k, "solver"), every[0], memory=None, counters=NodeCounters(), model_id="scripted"
        )
        solvers.append(
            ScriptedPeer(
                k,
                ScriptedSolver(study.solver_accuracy, seed=peer_seed),
                TaskSampler(base.tasks.specs(), dataset_seed=question_stream(peer_seed), rng_seed=peer_seed),
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


def shared_base(every: list[NodeSettings], resumed: list[Checkpoint | None]):
    """The run's one base model with one LoRA adapter per learner (--shared-base), each adapter
    from its node's checkpoint where it has one."""
    from sapo.training.models.policy import LoraOptions
    from sapo.training.models.shared_base import SharedLoraBase

    m = every[0].model
    return SharedLoraBase(
        m.model,
        len(every),
        lora=LoraOptions(rank=m.lora_rank, alpha=2 * m.lora_rank),
        seeds=[s.seed for s in every],
        models_dir=m.models_dir or every[0].run.data_dir / "models",
        device=m.device,
        prompt_style=m.prompt_style,
        one_shot=m.one_shot,
        precision=m.precision,
        generation_precision=m.generation_precision,
        adapters_from=[c.model_dir if c is not None else None for c in resumed],
    )
