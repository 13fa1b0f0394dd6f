"""A node: what it owns (policy, optimizer, inbox, counters, where its records go, its stop
signal), all given or built when it is constructed, and the blocking steps of its round. What
rounds change, the random streams and the task cursor among it, is a `NodeState` value: each
step takes what it needs as arguments and hands its result back, and `round.py:run_round` calls
them in order, for the daemon, the study and the benchmarks alike.
"""

from __future__ import annotations

import functools
import logging
import random
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from sapo.node.core.counters import NodeCounters
from sapo.node.core.intake import Intake, node_intake
from sapo.node.core.loading import load_node_policy
from sapo.node.core.memory import NodeMemory
from sapo.node.core.metrics import METRICS_FILE, MetricsLog, RoundRecord
from sapo.node.core.settings import NodeSettings
from sapo.node.core.state import NodeState, RandomStreams, RngState, TaskCursor, restore_state, stream_at
from sapo.sampling.balance import RoundPlan
from sapo.sampling.external_use import ExternalUse
from sapo.sampling.inbox import Inbox
from sapo.sampling.screen import ScreenReference, screen, winning
from sapo.sampling.standing import Standing
from sapo.sampling.strategies import SamplerState, choose_external
from sapo.sampling.training_set import TrainingSet, training_set
from sapo.training.completions.evaluation import HeldOutScores, heldout_problems, heldout_scores
from sapo.training.completions.generation import GenerationRequest, GenerationResult, generate_groups
from sapo.training.config import default_learning_rate
from sapo.training.learning.checkpoints import Checkpoint, latest_checkpoint, save_checkpoint
from sapo.training.learning.typicality import excess_surprise
from sapo.training.learning.update import UpdateStats, grpo_update, make_optimizer
from sapo.training.models.policy import Policy
from sapo.training.problems.rewards import Verifier, verifier_for
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import Problem, TaskSampler, TaskSpec, question_stream, reasoning_gym_version

log = logging.getLogger("sapo.node")

# Our own completions for external questions draw from a stream apart from the local ones.
AUGMENT_SEED_OFFSET = 500_000_003
# A round draws again from the inbox for the groups its screen refused, and screens those, at
# most this many times: an author the screen refuses costs the node a screening, not a J slot
# (issue #42: a fallen attacker that keeps a newcomer's share of the draw emptied 1 slot in 18),
# and a node whose inbox holds nothing but refused groups screens at most 3 J groups a round.
SCREEN_REDRAWS = 2


@dataclass(frozen=True)
class Selection:
    """The external groups a round chose, and the sampler's state and random stream after choosing them."""

    external: list[QuestionGroup]
    sampler: SamplerState
    rng: RngState


@dataclass(frozen=True)
class Screening:
    """What the screen made of a round's draw: the groups it kept (less the completions it
    dropped), those it refused, and the draw after the screen's redraws."""

    selection: Selection  # every group drawn, the redraws' too, and the sampler and stream after them
    kept: list[QuestionGroup]
    refused: list[QuestionGroup] = field(default_factory=list)
    dropped: int = 0  # completions dropped from groups it kept
    reference: ScreenReference | None = None  # with this round's own completions; None: no screen ran
    redrawn: int = 0  # groups drawn again in place of refused ones
    seconds: float = 0.0


class RoundLog(Protocol):
    """Where a node's round records go: DATA_DIR/metrics.jsonl (`MetricsLog`), or a harness's own."""

    def append(self, record: RoundRecord) -> None: ...

    def truncate_after(self, round_index: int) -> None: ...


def node_inbox(settings: NodeSettings) -> Inbox:
    """A node's inbox, bounded as its settings say, weighing authors by standing unless told not to."""
    s, trust = settings.sampling, settings.trust
    standing = Standing(trust.standing_ramp_seconds, trust.newcomer_share, mode=trust.standing)
    return Inbox(s.inbox_max_groups, s.inbox_max_bytes, s.inbox_max_age_seconds, s.inbox_peer_share, standing)


def choose_from_inbox(
    inbox: Inbox, use: ExternalUse, count: int, rng: random.Random, sampler: SamplerState, now: float
) -> tuple[list[QuestionGroup], SamplerState]:
    """Up to `count` of the inbox's groups as of `now`, by the node's sampler, each author's chance
    following its standing where the inbox keeps one; and the sampler's state after."""
    candidates = inbox.newest_first(now)
    weights = inbox.standing.draw_weights((g.origin for g in candidates), now)
    return choose_external(use.sampler, candidates, count, rng, sampler, weights)


class Node:
    def __init__(
        self,
        settings: NodeSettings,
        peer_id: str = "local",
        warm_start_tasks: list[TaskSpec] | None = None,
        verifier: Verifier | None = None,
        policy: Policy | None = None,
        metrics: RoundLog | None = None,
        counters: NodeCounters | None = None,
        stop: threading.Event | None = None,
        checkpoint: Checkpoint | None = None,
        fresh_completions_on_resume: bool = True,
    ):
        """`policy`: one the caller built (a node on a shared base, training/models/shared_base.py);
        such a node resumes only from `checkpoint`, the one the caller loaded the policy from
        (its optimizer and state), and otherwise starts fresh. A node that builds its own policy
        resumes from its last checkpoint, if any: `start_state()` is where its rounds go on.
        `metrics`: where its round records go (DATA_DIR/metrics.jsonl unless given).
        `counters`: what it counts of its traffic (the daemon's carry the gossip layer's own).
        `stop`: once it is set (on shutdown), generation, the longest step, stops at its next token.
        `fresh_completions_on_resume`: see `generation_seed`; False only where every peer resumes
        from the same round too (a study's run), which then goes on exactly as if never stopped."""
        settings = settings.seeded_for(peer_id)  # unset: the node's own, from its identity
        self.settings = settings
        self.peer_id = peer_id
        # How this node scores its own completions (benchmarks substitute one that forces signal).
        self.verifier = verifier or verifier_for(settings.training.reward)
        run = settings.run
        self.data_dir = run.data_dir
        self.checkpoints_dir = self.data_dir / "checkpoints"
        self.metrics: RoundLog = metrics if metrics is not None else MetricsLog(self.data_dir / METRICS_FILE)
        self.counters = counters if counters is not None else NodeCounters()
        self.stop_requested = stop if stop is not None else threading.Event()
        self.resumed_from = latest_checkpoint(self.checkpoints_dir) if policy is None else checkpoint
        self.fresh_completions_on_resume = fresh_completions_on_resume
        self.policy = policy if policy is not None else load_node_policy(settings, self.resumed_from, warm_start_tasks)
        train = settings.training
        if train.lr is None:
            train = train.model_copy(update={"lr": default_learning_rate(settings.model.model, settings.model.lora)})
        self.training = train  # the training settings with the learning rate resolved
        self.use = settings.external_use
        self.optimizer = None if run.generate_only else make_optimizer(self.policy, train)
        self.task_specs = settings.tasks.specs()
        self.heldout = heldout_problems(self.task_specs, run.eval_questions) if run.eval_every else None
        self.trust = settings.trust
        self.inbox = node_inbox(settings)
        self.memory = NodeMemory(self.inbox, self._intake(), self.counters)
        self.memory_restored = False  # True once its checkpoint's memory is back
        self._restore_memory()
        self.balance = settings.sampling.balance_rule(trains=not run.generate_only)

    def _intake(self) -> Intake:
        return node_intake(
            self.settings,
            self.counters,
            peer_id=self.peer_id,
            rg_version=reasoning_gym_version(),
            verifier=self.verifier,
        )

    def _restore_memory(self) -> None:
        """What it had learnt of its peers, as of its checkpoint. A memory it cannot read (another
        release's, a damaged file) is left behind, with a warning: a node that cannot start over
        its peers' groups would be a worse loss than the groups."""
        try:
            saved = self.resumed_from.memory() if self.resumed_from is not None else None
            if saved is not None:
                self.memory.restore(saved)
                self.memory_restored = True
                log.info("memory of peers restored: %s", self.memory.describe())
        except Exception as error:  # noqa: BLE001 - anything in a file it did not write this run
            log.warning("could not restore the memory of peers (%s); starting with none", error)
            self.inbox = node_inbox(self.settings)
            self.counters.restore(NodeCounters().to_json())
            self.memory = NodeMemory(self.inbox, self._intake(), self.counters)

    def start_state(self) -> NodeState:
        """Where this node's rounds start: its checkpoint's state (restoring the optimizer to that
        round), or round 0, its random streams seeded by --seed."""
        first = NodeState(balance=self.balance.initial(), streams=RandomStreams.from_seed(self.settings.seed))
        if self.resumed_from is None:
            return first
        trainer = self.resumed_from.trainer_state()
        if self.optimizer is not None and trainer.get("optimizer") is not None:
            self.optimizer.load_state_dict(trainer["optimizer"])
        state = restore_state(self.resumed_from.state(), trainer, first)
        self.metrics.truncate_after(state.round)
        log.info("resumed from %s at round %d", self.resumed_from.path, state.round)
        return state

    # --- one round's steps, in data-flow order -------------------------------------------

    def plan(self, state: NodeState) -> RoundPlan:
        """The next round's I and J, from the node's balance."""
        return self.balance.plan(state.balance, state.round + 1)

    def generation_seed(self, plan: RoundPlan, offset: int = 0) -> int:
        """The seed of a round's sampling: fixed by --seed and the round, so that a node that
        never resumes (every study run) is reproducible. A node resumed from a checkpoint mixes
        in a nonce drawn once per start: it would otherwise sample again exactly the completions
        it published for the rounds after that checkpoint, and its peers would refuse them and
        charge it `repeat` (5 points each, a ban after 20). Its questions do repeat (the task
        stream is restored), its completions do not. A study's run resumes all its nodes and
        their inboxes and memories together, from one round, which nothing else saw: there the
        nodes draw no nonce (`fresh_completions_on_resume=False`) and repeat the run exactly."""
        seed = self.settings.seed * 1_000_003 + plan.index + offset
        if self.resumed_from is None or not self.fresh_completions_on_resume:
            return seed
        return (seed + self._start_nonce) % 2**32  # the sampler keeps 32 bits of a seed

    @functools.cached_property
    def _start_nonce(self) -> int:
        # far from 0, so that no round after the resume meets the seed of a round before it
        return 2**20 + secrets.randbelow(2**31)

    def questions(self, plan: RoundPlan, cursor: TaskCursor) -> tuple[list[Problem], TaskCursor]:
        """This round's I questions, the next ones from the node's task stream at `cursor`, and
        where the stream goes on after them. With --draw-questions N the round draws N and asks
        the first I, so the stream stands at the same place every round whatever I is."""
        drawn = self.settings.run.draw_questions or plan.local
        if plan.local > drawn:  # the settings refuse this; an adaptive balance must not reach it
            raise ValueError(f"round {plan.index} asks {plan.local} questions of the {drawn} it draws")
        tasks = TaskSampler(self.task_specs, dataset_seed=question_stream(self.settings.seed), rng_seed=0)
        tasks.load_state_dict(cursor.model_dump())  # the stream's state is the cursor's, whatever the seed
        problems = tasks.sample(plan.local)
        tasks.skip(drawn - plan.local)
        return problems, TaskCursor.model_validate(tasks.state_dict())

    def generation_request(self, plan: RoundPlan, questions: list[Problem]) -> GenerationRequest:
        """How this node samples this round's questions."""
        return GenerationRequest(
            self.policy,
            questions,
            seed=self.generation_seed(plan),
            sender_round=plan.index,
            verifier=self.verifier,
            record_behavior=self.use.share_logprobs,  # published with the groups
        )

    def generate(self, plan: RoundPlan, questions: list[Problem]) -> GenerationResult:
        """This round's I local groups, sampled from the node's own policy and scored by its verifier."""
        request, t = self.generation_request(plan, questions), self.training
        return generate_groups(
            request.policy,
            request.problems,
            num_generations=t.generations,
            max_new_tokens=t.max_new_tokens,
            temperature=t.temperature,
            seed=request.seed,
            sender_round=request.sender_round,
            stop=self.stop_requested,
            verifier=request.verifier,
            record_behavior=request.record_behavior,
        )

    def mix(self, plan: RoundPlan, state: NodeState, now: float) -> Selection:
        """Up to J external groups from the inbox, as of `now`, chosen by the node's sampler from
        the state's. Reads the inbox; the round takes the chosen groups out of it. With standing,
        each author's chance follows its standing (sampling/standing.py)."""
        rng = stream_at(state.streams.mix)
        external, sampler = choose_from_inbox(self.inbox, self.use, plan.external, rng, state.sampler, now)
        return Selection(external, sampler, rng.getstate())

    def screen(
        self, plan: RoundPlan, generation: GenerationResult, selection: Selection, state: NodeState, now: float
    ) -> Screening:
        """The chosen groups screened (sampling/screen.py) against the bar this node's own
        winning completions set, this round's included; each screened group's author loses
        standing in proportion to the completions the screen dropped. For the groups it refused,
        the round draws again from the inbox as of `now` (taking them out of it, as the round
        took the first draw) and screens those, at most SCREEN_REDRAWS times. It measures at most
        G winners of a group (its own G; the rest are dropped), so a round's screening is at most
        (1 + SCREEN_REDRAWS) J groups of its own size. A node that adds its own completions to
        peers' groups judges every completion with a reward (sampling/screen.py's `judged`). Runs
        the policy: call it where torch may run."""
        if self.trust.screen != "typicality" or not selection.external:
            return Screening(selection, selection.external)
        started = time.perf_counter()
        limit = self.training.max_new_tokens
        own = excess_surprise(self.policy, winning(generation.groups), limit)
        drawn, reference = selection.external, state.screen
        kept: list[QuestionGroup] = []
        refused: list[QuestionGroup] = []
        dropped = redrawn = 0
        augmented = self.use.augment_external > 0  # our own completions will join each group
        most = self.training.generations  # winners measured a group: what our own group holds
        for redraws_left in range(SCREEN_REDRAWS, -1, -1):
            excess = excess_surprise(self.policy, winning(drawn, augmented, most), limit)
            verdict = screen(drawn, excess, own, reference, self.trust, augmented, most)
            own = []  # this round's own completions join the reference once
            for group, share in zip(drawn, verdict.dropped_shares, strict=True):
                if share is not None:
                    self.inbox.standing.screened(group.origin, share)
            kept, refused = kept + verdict.kept, refused + verdict.refused
            dropped, reference = dropped + verdict.dropped, verdict.reference
            if not verdict.refused or not redraws_left:
                break
            selection, drawn = self.redraw(selection, len(verdict.refused), now)
            if not drawn:
                break
            redrawn += len(drawn)
        return Screening(selection, kept, refused, dropped, reference, redrawn, time.perf_counter() - started)

    def redraw(self, selection: Selection, count: int, now: float) -> tuple[Selection, list[QuestionGroup]]:
        """`count` more of the inbox's groups as of `now`, drawn as `mix` draws, from where its
        sampler and stream got to, and taken out of the inbox; and the selection with them."""
        rng = stream_at(selection.rng)
        more, sampler = choose_from_inbox(self.inbox, self.use, count, rng, selection.sampler, now)
        self.inbox.take(more)  # a group is screened and trains once
        return Selection([*selection.external, *more], sampler, rng.getstate()), more

    def prepare(self, plan: RoundPlan, generation: GenerationResult, screening: Screening) -> TrainingSet:
        """The round's training set: its local groups and the external groups the screen kept,
        with the node's `ExternalUse` applied, and its own completions for each external question
        when it augments (runs the policy: call it where torch may run)."""
        external = screening.kept
        own = self.own_completions(plan, external, self.use.augment_external)
        prepared = training_set(
            generation.groups,
            external,
            self.use,
            self.policy.tokenizer_fingerprint,
            own=own.groups if own else None,
            augment_tokens=own.new_tokens if own else 0,
        )
        return replace(
            prepared,
            refused=screening.refused,
            screened_completions=screening.dropped,
            screen=screening.reference,
            screen_seconds=screening.seconds,
            redrawn=screening.redrawn,
        )

    def own_completions(self, plan: RoundPlan, external: list[QuestionGroup], count: int) -> GenerationResult | None:
        """`count` completions of this node's own for each external question, or None."""
        if not count or not external:
            return None
        t = self.training
        return generate_groups(
            self.policy,
            [g.problem for g in external],
            num_generations=count,
            max_new_tokens=t.max_new_tokens,
            temperature=t.temperature,
            seed=self.generation_seed(plan, AUGMENT_SEED_OFFSET),
            stop=self.stop_requested,
            verifier=self.verifier,
        )

    def train(self, training: TrainingSet, rng: RngState) -> tuple[UpdateStats | None, RngState]:
        """The GRPO step on the round's training set, its minibatches ordered by the stream at
        `rng`; and where that stream goes on. None for a node that does not train."""
        if self.optimizer is None:
            return None, rng
        stream = stream_at(rng)
        return grpo_update(self.policy, self.optimizer, training.rows, self.training, stream), stream.getstate()

    def evaluation_due(self, round_index: int) -> bool:
        every = self.settings.run.eval_every
        return every > 0 and round_index % every == 0

    def evaluate(self, round_index: int = 0) -> HeldOutScores:
        """Full-credit accuracy per task on the held-out questions: greedy, and sampled with
        --eval-samples (each node and round its own seed, so a run repeats exactly)."""
        return heldout_scores(
            self.policy,
            self.heldout or {},
            self.training.max_new_tokens,
            samples=self.settings.run.eval_samples,
            temperature=self.training.temperature,
            seed=self.settings.seed * 100_003 + round_index,
        )

    def next_state(
        self,
        state: NodeState,
        plan: RoundPlan,
        record: RoundRecord,
        selection: Selection,
        training: TrainingSet,
        streams: RandomStreams,
    ) -> NodeState:
        """The state after this round: its totals, what the balance learnt from it, where the
        random streams got to, the sampler's state and the screen's reference."""
        return NodeState(
            round=plan.index,
            cumulative_reward=record.cumulative_reward,
            balance=self.balance.observe(state.balance, plan, record.external_groups, record.reward_mean),
            streams=streams,
            sampler=selection.sampler,
            screen=training.screen if training.screen is not None else state.screen,
        )

    # --- persistence ------------------------------------------------------------------------

    def checkpoint_due(self, round_index: int) -> bool:
        every = self.settings.run.checkpoint_every
        return every > 0 and round_index % every == 0

    def checkpoint(self, state: NodeState) -> Checkpoint:
        policy = self.policy

        def write_model(path: Path) -> None:
            model: Any = policy.model  # a transformers or a peft model: both save_pretrained
            model.save_pretrained(path)
            policy.tokenizer.save_pretrained(path)

        trainer_state = {"optimizer": self.optimizer.state_dict() if self.optimizer else None}
        node_state = state.to_json() | {
            "peer_id": self.peer_id,
            "settings": self.settings.flat() | {"data_dir": str(self.data_dir)},
        }
        checkpoint = save_checkpoint(
            self.checkpoints_dir,
            state.round,
            write_model,
            trainer_state,
            node_state,
            keep=self.settings.run.keep_checkpoints,
            memory=self.memory.to_json(),
        )
        log.info("checkpoint written: %s", checkpoint.path)
        return checkpoint
