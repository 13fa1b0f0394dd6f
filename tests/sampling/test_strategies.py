"""The samplers that choose J external groups."""

import random

import pytest

from sapo.sampling.strategies import PEER_LIMIT, SEEN_LIMIT, SamplerState, choose_external, has_correct, seen_key
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs


def _group(origin: str, rewards: list[float], problem) -> QuestionGroup:
    return QuestionGroup(problem=problem, completions=["x"] * len(rewards), rewards=rewards, origin=origin)


def test_samplers_of_our_own():
    problems = TaskSampler(default_task_specs(["basic_arithmetic"]), 0, 0).sample(40)
    junk = [_group("junk", [0.0, 0.5], p) for p in problems[:20]]
    good = [_group("good", [0.0, 1.0], p) for p in problems[20:]]
    assert has_correct(junk + good, 50, random.Random(0)) == good
    chosen, state = choose_external("peer-weighted", junk + good, 10, random.Random(0), SamplerState())
    assert sum(g.origin == "good" for g in chosen) >= 7
    assert state.usefulness["good"] > 0.5 > state.usefulness["junk"] and len(state.seen) == 40
    # a group offered again (it stayed in the inbox) is counted once, even after a restart
    restored = SamplerState.model_validate_json(state.model_dump_json())
    _, again = choose_external("peer-weighted", junk + good, 10, random.Random(0), restored)
    assert again == state
    with pytest.raises(ValueError, match="peer-weighted"):
        choose_external("nope", junk, 1, random.Random(0), SamplerState())


def test_the_peer_weighted_state_is_bounded():
    problems = TaskSampler(default_task_specs(["basic_arithmetic"]), 0, 0).sample(8)
    state = SamplerState()
    for k in range(0, 2 * SEEN_LIMIT, 64):  # many peers, each offering new groups
        groups = [_group(f"peer{k + i}", [0.0, 1.0], problems[i % 8]) for i in range(64)]
        _, state = choose_external("peer-weighted", groups, 4, random.Random(k), state)
    assert len(state.seen) == SEEN_LIMIT and len(state.usefulness) == PEER_LIMIT
    assert f"peer{2 * SEEN_LIMIT - 1}" in state.usefulness and "peer0" not in state.usefulness


def test_the_key_a_saved_sampler_state_holds_is_unchanged():
    """`SamplerState.seen` is kept in checkpoints: a resumed node must count its groups as before."""
    problem = TaskSampler(default_task_specs(["basic_arithmetic"]), 0, 0).sample(1)[0]
    group = QuestionGroup(problem=problem, completions=["a", "b"], rewards=[0.0, 1.0], origin="peer", sender_round=3)
    assert seen_key(group) == "2797a0b22e8baa1cd2e89afc"
