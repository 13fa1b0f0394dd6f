"""A node's learning state and the blocking steps of its round: generate, mix, train, then
summarize the round and advance the running totals; and checkpoints.

Each step takes what it needs as arguments (this round's `RoundPlan`, the generation, the
training set) and hands its result back: no step reads what another left on the node.
`round.py:run_round` calls them in order, for the daemon, the study and the benchmarks alike.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from pathlib import Path

import torch

from sapo.node.daemon.counters import NodeCounters
from sapo.node.daemon.metrics import MetricsLog, RoundRecord
from sapo.node.daemon.settings import NodeSettings
from sapo.sampling.balance import AdaptiveBalance, FixedBalance, RoundPlan
from sapo.sampling.external import augmented, with_exact_credit
from sapo.sampling.inbox import Inbox
from sapo.sampling.mixer import TrainingSet, mix
from sapo.sampling.strategies import get_sampler
from sapo.training.checkpoints import Checkpoint, latest_checkpoint, save_checkpoint
from sapo.training.config import default_learning_rate
from sapo.training.evaluation import heldout_accuracy, heldout_problems, is_correct
from sapo.training.generation import GenerationRequest, GenerationResult, generate_groups
from sapo.training.policy import LoraOptions, Policy, load_policy
from sapo.training.rewards import Verifier, has_answer_tag, verifier_for
from sapo.training.tasks import TaskSampler, TaskSpec
from sapo.training.sources import is_tiny
from sapo.training.update import UpdateStats, grpo_update, make_optimizer
from sapo.training.warmstart import WarmStartSettings, cached_warm_start

log = logging.getLogger("sapo.node")

# Our own completions for external questions draw from a stream apart from the local ones.
AUGMENT_SEED_OFFSET = 500_000_003

def warm_start_settings(settings: NodeSettings) -> WarmStartSettings | None:
    m = settings.model
    steps = m.warm_start_steps if m.warm_start_steps is not None else (200 if is_tiny(m.model) else 0)
    if steps == 0 or m.lora:  # settings refuse an explicit warm start with --lora
        return None
    # A fixed seed, not the node's: the warm start stands in for a pretrained checkpoint, and
    # like the paper's 8 x Qwen2.5 every node of a swarm starts from the same one.
    share, shares = map(int, (m.warm_start_share or "0/1").split("/"))
    return WarmStartSettings(
        steps=steps, tag_rate=m.warm_start_tag_rate, answer_noise=m.warm_start_answer_noise, share=share % shares, shares=shares
    )


class Node:
    def __init__(
        self,
        settings: NodeSettings,
        peer_id: str = "local",
        warm_start_tasks: list[TaskSpec] | None = None,
        verifier: Verifier | None = None,
        policy: Policy | None = None,
    ):
        """`policy`: one the caller built (a node on a shared base, training/shared_base.py);
        such a node starts fresh and does not resume from checkpoints."""
        self.settings = settings
        self.peer_id = peer_id
        # How this node scores its own completions (benchmarks substitute one that forces signal).
        self.verifier = verifier or verifier_for(settings.training.reward)
        # A specialist (experiment harness) warm-starts on a subset of the tasks it then asks.
        self.warm_start_tasks = warm_start_tasks
        run = settings.run
        self.data_dir = run.data_dir
        self.checkpoints_dir = self.data_dir / "checkpoints"
        self.metrics = MetricsLog(self.data_dir / "metrics.jsonl")
        self.counters = NodeCounters()
        # Set on shutdown: generation (the longest step) stops at its next token.
        self.stop_requested = threading.Event()
        if settings.model.torch_threads:
            torch.set_num_threads(settings.model.torch_threads)
        self.models_dir = settings.model.models_dir or self.data_dir / "models"
        self.warm_start = warm_start_settings(settings)
        checkpoint = latest_checkpoint(self.checkpoints_dir) if policy is None else None
        self.policy = policy if policy is not None else self._load_policy(checkpoint)
        train = settings.training
        if train.lr is None:
            train = train.model_copy(update={"lr": default_learning_rate(settings.model.model, settings.model.lora)})
        self.training = train
        self.optimizer = None if run.generate_only else make_optimizer(self.policy, train)
        self.tasks = TaskSampler(settings.tasks.specs(), dataset_seed=run.seed, rng_seed=run.seed)
        self.heldout = heldout_problems(settings.tasks.specs(), run.eval_questions) if run.eval_every else None
        self.mix_rng = random.Random(run.seed + 1)
        self.update_rng = random.Random(run.seed + 2)
        s = settings.sampling
        self.inbox = Inbox(s.inbox_max_groups, s.inbox_max_bytes, s.inbox_max_age_seconds, s.inbox_peer_share)
        self.sampler = get_sampler(s.sampler)
        self.balance = (
            AdaptiveBalance(total=s.local + s.external, external=s.external, period=s.balance_period)
            if s.balance == "adaptive"
            else FixedBalance(s.local, s.external)
        )
        self.last_reward: float | None = None
        self.round = 0
        self.cumulative_reward = 0.0
        if checkpoint is not None:
            self._restore(checkpoint)

    def _load_policy(self, checkpoint: Checkpoint | None) -> Policy:
        m = self.settings.model
        weights_from = adapter_from = None
        if checkpoint is not None:
            if m.lora:
                adapter_from = checkpoint.model_dir
            else:
                weights_from = checkpoint.model_dir
        elif self.warm_start is not None:
            weights_from = cached_warm_start(
                m.model,
                model_seed=self.warm_start.seed,
                tasks=self.warm_start_tasks or self.settings.tasks.specs(),
                settings=self.warm_start,
                models_dir=self.models_dir,
                device=m.device,
            )
        return load_policy(
            m.model,
            device=m.device,
            lora=LoraOptions(rank=m.lora_rank, alpha=2 * m.lora_rank) if m.lora else None,
            seed=self.settings.run.seed,
            models_dir=self.models_dir,
            prompt_style=m.prompt_style,
            one_shot=m.one_shot,
            weights_from=weights_from,
            adapter_from=adapter_from,
            precision=m.precision,
            generation_precision=m.generation_precision,
        )

    # --- one round's steps, in data-flow order -------------------------------------------

    def plan(self, round_index: int) -> RoundPlan:
        """This round's I and J, from the node's balance (fixed, or adaptive)."""
        return self.balance.plan(round_index)

    def generation_request(self, plan: RoundPlan) -> GenerationRequest:
        """This round's I questions (drawn from the task stream now: once a round) and how this
        node samples them."""
        return GenerationRequest(
            self.policy,
            self.tasks.sample(plan.local),
            seed=self.settings.run.seed * 1_000_003 + plan.index,
            sender_round=plan.index,
            verifier=self.verifier,
            record_behavior=self.settings.network.share_logprobs,  # published with the groups
        )

    def generate(self, plan: RoundPlan) -> GenerationResult:
        """This round's I local groups, sampled from the node's own policy and scored by its verifier."""
        request, t = self.generation_request(plan), self.training
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

    def mix(self, plan: RoundPlan, generation: GenerationResult, now: float) -> TrainingSet:
        """The round's local groups with up to J external ones from the inbox, as of `now`,
        prepared as the settings say: our own completions added to each external question
        (which samples from the policy: run it where torch may run), then exact credit."""
        s = self.settings.sampling
        chosen = mix(generation.groups, self.inbox, plan.external, self.sampler, self.mix_rng, now)
        external, added_tokens = chosen.external, 0
        if s.augment_external and external:
            t = self.training
            own = generate_groups(
                self.policy,
                [g.problem for g in external],
                num_generations=s.augment_external,
                max_new_tokens=t.max_new_tokens,
                temperature=t.temperature,
                seed=self.settings.run.seed * 1_000_003 + plan.index + AUGMENT_SEED_OFFSET,
                stop=self.stop_requested,
                verifier=self.verifier,
            )
            external, added_tokens = [augmented(g, o) for g, o in zip(external, own.groups)], own.new_tokens
        if s.external_credit == "exact":
            external = [with_exact_credit(g) for g in external]
        return TrainingSet(chosen.local, external, added_tokens)

    def train(self, training_set: TrainingSet) -> UpdateStats | None:
        if self.optimizer is None:
            return None
        return grpo_update(self.policy, self.optimizer, training_set.groups, self.training, self.update_rng)

    def evaluation_due(self, round_index: int) -> bool:
        every = self.settings.run.eval_every
        return every > 0 and round_index % every == 0

    def evaluate(self) -> dict[str, float]:
        """Greedy full-credit accuracy per task on the held-out questions."""
        return heldout_accuracy(self.policy, self.heldout or {}, self.training.max_new_tokens)

    def summarize(
        self,
        plan: RoundPlan,
        generation: GenerationResult,
        training_set: TrainingSet,
        update: UpdateStats | None,
        round_seconds: float,
        peers: list[str],
        heldout: dict[str, float] | None = None,
    ) -> RoundRecord:
        """What the round did, as one metrics record; changes nothing."""
        rewards = [r for g in generation.groups for r in g.rewards]
        completions = [c for g in generation.groups for c in g.completions]
        reward_mean = sum(rewards) / len(rewards) if rewards else 0.0
        by_task: dict[str, list[float]] = {}
        for g in generation.groups:
            by_task.setdefault(g.problem.spec.dataset, []).extend(g.rewards)
        external = [r for g in training_set.external for r in g.rewards]
        return RoundRecord(
            round=plan.index,
            time=time.time(),
            reward_mean=reward_mean,
            cumulative_reward=self.cumulative_reward + reward_mean,
            format_rate=sum(map(has_answer_tag, completions)) / len(completions) if completions else 0.0,
            accuracy=sum(map(is_correct, rewards)) / len(rewards) if rewards else 0.0,
            heldout=heldout,
            per_task={k: sum(v) / len(v) for k, v in sorted(by_task.items())},
            local_groups=len(training_set.local),
            external_planned=plan.external,
            external_groups=len(training_set.external),
            external_reward_mean=sum(external) / len(external) if external else None,
            inbox_size=len(self.inbox),
            received=self.counters.received,
            accepted=self.counters.accepted,
            rejected=self.counters.all_rejections(),
            transport=dict(self.counters.transport),
            accepted_from=dict(self.counters.accepted_from),
            published=self.counters.published,
            peers=peers,
            generate_seconds=generation.seconds,
            train_seconds=update.seconds if update else 0.0,
            round_seconds=round_seconds,
            generated_tokens=generation.new_tokens,
            augment_tokens=training_set.augment_tokens,
            update_tokens=update.tokens if update else 0,
            tokens_per_second=generation.new_tokens / generation.seconds if generation.seconds > 0 else 0.0,
            loss=None if update is None or update.skipped else update.loss,
            clip_fraction=None if update is None or update.skipped else update.clip_fraction,
        )

    def advance(self, record: RoundRecord) -> None:
        """The round is done: move the running totals on, and let the balance see its effect
        (the previous round's step shows up in this round's reward)."""
        if self.last_reward is not None:
            self.balance.observe(record.round - 1, record.reward_mean - self.last_reward)
        self.last_reward = record.reward_mean
        self.round = record.round
        self.cumulative_reward = record.cumulative_reward

    # --- persistence ------------------------------------------------------------------------

    def checkpoint_due(self, round_index: int) -> bool:
        every = self.settings.run.checkpoint_every
        return every > 0 and round_index % every == 0

    def checkpoint(self) -> Checkpoint:
        policy = self.policy

        def write_model(path: Path) -> None:
            policy.model.save_pretrained(path)
            policy.tokenizer.save_pretrained(path)

        trainer_state = {
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "torch_rng": torch.get_rng_state(),
            "mix_rng": self.mix_rng.getstate(),
            "update_rng": self.update_rng.getstate(),
            "tasks": self.tasks.state_dict(),
            "balance": self.balance.state_dict(),
            "last_reward": self.last_reward,
        }
        state = {
            "round": self.round,
            "cumulative_reward": self.cumulative_reward,
            "peer_id": self.peer_id,
            "settings": self.settings.flat() | {"data_dir": str(self.data_dir)},
        }
        checkpoint = save_checkpoint(
            self.checkpoints_dir, self.round, write_model, trainer_state, state, keep=self.settings.run.keep_checkpoints
        )
        log.info("checkpoint written: %s", checkpoint.path)
        return checkpoint

    def _restore(self, checkpoint: Checkpoint) -> None:
        state = checkpoint.state()
        trainer = checkpoint.trainer_state()
        if self.optimizer is not None and trainer.get("optimizer") is not None:
            self.optimizer.load_state_dict(trainer["optimizer"])
        torch.set_rng_state(trainer["torch_rng"])
        self.mix_rng.setstate(_as_state(trainer["mix_rng"]))
        self.update_rng.setstate(_as_state(trainer["update_rng"]))
        self.tasks.load_state_dict(trainer["tasks"])
        if trainer.get("balance"):
            self.balance.load_state_dict(trainer["balance"])
        self.last_reward = trainer.get("last_reward")
        self.round = int(state["round"])
        self.cumulative_reward = float(state["cumulative_reward"])
        self.metrics.truncate_after(self.round)
        log.info("resumed from %s at round %d", checkpoint.path, self.round)


def _as_state(state):
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
