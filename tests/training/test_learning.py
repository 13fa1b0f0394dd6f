"""GRPO really learns: a tiny model discovers the answer format and its reward rises.

The warm start writes only 30 % of its targets inside <answer> tags, so greedy decoding
starts untagged (reward ~0). GRPO must find that tagged answers earn reward and shift the
policy: this fails if the loss sign, the advantages or the optimizer step is broken.
"""

import random
from pathlib import Path

import torch

from sapo.training.completions.evaluation import heldout_accuracy, heldout_problems
from sapo.training.completions.generation import generate_groups
from sapo.training.config import TrainingSettings
from sapo.training.learning.update import grpo_update, make_optimizer
from sapo.training.learning.warmstart import WarmStartSettings, warm_start
from sapo.training.models.policy import load_policy
from sapo.training.problems.tasks import TaskSampler, default_task_specs
from tests.support.rows import rows_of

ROUNDS = 30


def test_tiny_model_reward_rises_on_easy_addition(tmp_path: Path):
    torch.set_num_threads(1)
    (spec,) = default_task_specs(["basic_arithmetic"])
    tasks = [spec.model_copy(update={"config": {**spec.config, "operators": ["+"]}})]
    policy = load_policy("tiny", device="cpu", seed=0, models_dir=tmp_path)
    warm_start(policy, tasks, WarmStartSettings(steps=300, tag_rate=0.3))
    heldout = heldout_problems(tasks, 128, dataset_seed=999)
    before = heldout_accuracy(policy, heldout, max_new_tokens=24)["basic_arithmetic"]

    settings = TrainingSettings(lr=1e-4, max_new_tokens=24, generations=8)
    optimizer = make_optimizer(policy, settings)
    sampler = TaskSampler(tasks, dataset_seed=1, rng_seed=1)
    rng = random.Random(0)
    rewards = []
    for round_index in range(1, ROUNDS + 1):
        generation = generate_groups(policy, sampler.sample(8), num_generations=8, max_new_tokens=24, seed=round_index)
        batch = [r for g in generation.groups for r in g.rewards]
        rewards.append(sum(batch) / len(batch))
        grpo_update(policy, optimizer, rows_of(policy, generation.groups), settings, rng)
    after = heldout_accuracy(policy, heldout, max_new_tokens=24)["basic_arithmetic"]

    early, late = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert late > early + 0.05, f"sampled reward did not rise: {early:.3f} -> {late:.3f}"
    assert after > before + 0.1, f"held-out greedy accuracy did not rise: {before:.3f} -> {after:.3f}"
