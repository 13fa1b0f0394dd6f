"""The warm-started tiny policy (as tests/training/test_typicality.py builds it, so its bar
refuses injected text), some of its own groups, and questions, shared by the screen attack tests."""

from __future__ import annotations

import pytest
import torch

from sapo.training.completions.generation import generate_groups
from sapo.training.learning.warmstart import WarmStartSettings, warm_start
from sapo.training.models.policy import load_policy
from sapo.training.problems.tasks import TaskSampler, default_task_specs


@pytest.fixture(scope="package")
def policy_and_problems(tmp_path_factory):
    torch.set_num_threads(1)
    tasks = default_task_specs(["basic_arithmetic"])
    policy = load_policy("tiny", device="cpu", seed=0, models_dir=tmp_path_factory.mktemp("models"))
    warm_start(policy, tasks, WarmStartSettings(steps=150))
    problems = TaskSampler(tasks, dataset_seed=5, rng_seed=5).sample(40)
    own = generate_groups(policy, problems[:4], num_generations=8, max_new_tokens=32, seed=1).groups
    return policy, problems, own
