"""The session's warm-started tiny policy (tests/conftest.py's `screen_policy`, whose bar refuses
injected text), some of its own groups, and questions, shared by the screen attack tests."""

from __future__ import annotations

import pytest

from sapo.training.completions.generation import generate_groups
from sapo.training.problems.tasks import TaskSampler, default_task_specs


@pytest.fixture(scope="package")
def policy_and_problems(screen_policy):
    problems = TaskSampler(default_task_specs(["basic_arithmetic"]), dataset_seed=5, rng_seed=5).sample(40)
    own = generate_groups(screen_policy, problems[:4], num_generations=8, max_new_tokens=32, seed=1).groups
    return screen_policy, problems, own
