"""The samplers that choose J external groups."""

import random

import pytest

from sapo.sampling.strategies import get_sampler, has_correct
from sapo.training.rollouts import QuestionGroup
from sapo.training.tasks import TaskSampler, default_task_specs


def _group(origin: str, rewards: list[float], problem) -> QuestionGroup:
    return QuestionGroup(problem=problem, completions=["x"] * len(rewards), rewards=rewards, origin=origin)


def test_samplers_of_our_own():
    problems = TaskSampler(default_task_specs(["basic_arithmetic"]), 0, 0).sample(40)
    junk = [_group("junk", [0.0, 0.5], p) for p in problems[:20]]
    good = [_group("good", [0.0, 1.0], p) for p in problems[20:]]
    assert has_correct(junk + good, 50, random.Random(0)) == good
    sampler = get_sampler("peer-weighted")
    assert sampler is not get_sampler("peer-weighted")  # stateful: one per node
    chosen = sampler(junk + good, 10, random.Random(0))
    assert sum(g.origin == "good" for g in chosen) >= 7
    with pytest.raises(ValueError, match="peer-weighted"):
        get_sampler("nope")
