import random

from sapo.sampling.inbox import Inbox, group_size_bytes
from sapo.sampling.strategies import SamplerState, choose_external, drop_zero_advantage, nonzero_uniform, uniform
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import Problem, ProblemSpec


def group(origin="peerA", index=0, rewards=(0.0, 1.0), text="x"):
    spec = ProblemSpec(dataset="basic_arithmetic", config={}, seed=1, index=index)
    problem = Problem(spec=spec, question="Calculate 1 + 1.", answer="2")
    return QuestionGroup(problem=problem, completions=[text] * len(rewards), rewards=list(rewards), origin=origin)


def test_count_cap_evicts_oldest_first():
    inbox = Inbox(max_groups=3, max_bytes=10**6, max_age_seconds=100)
    for i in range(5):
        inbox.add(group(origin=f"p{i}", index=i), now=0)
    assert [g.problem.spec.index for g in inbox.newest_first(now=0)] == [4, 3, 2]
    assert inbox.evicted == 2


def test_byte_cap_holds():
    g = group(text="y" * 100)
    size = group_size_bytes(g)
    inbox = Inbox(max_groups=100, max_bytes=size * 3, max_age_seconds=100)
    for i in range(10):
        inbox.add(group(origin=f"p{i}", index=i, text="y" * 100), now=0)
    assert len(inbox) == 3 and inbox.size_bytes <= size * 3
    assert not inbox.add(group(text="z" * (size * 4)), now=0)  # alone too big


def test_age_limit():
    inbox = Inbox(max_groups=10, max_bytes=10**6, max_age_seconds=5)
    inbox.add(group(index=1), now=0)
    inbox.add(group(index=2), now=4)
    assert len(inbox.newest_first(now=6)) == 1
    assert inbox.newest_first(now=100) == []


def test_one_peer_cannot_fill_the_inbox():
    inbox = Inbox(max_groups=8, max_bytes=10**6, max_age_seconds=100, peer_share=0.25)
    inbox.add(group(origin="honest", index=0), now=0)
    for i in range(100):
        inbox.add(group(origin="flooder", index=i), now=1)
    origins = [g.origin for g in inbox.newest_first(now=1)]
    assert origins.count("flooder") == 2 and "honest" in origins


def test_zero_advantage_filter_and_uniform_sampling():
    groups = [group(index=i, rewards=(1.0, 1.0) if i % 2 else (0.0, 1.0)) for i in range(10)]
    kept = drop_zero_advantage(groups)
    assert [g.problem.spec.index for g in kept] == [0, 2, 4, 6, 8]
    chosen = nonzero_uniform(groups, 3, random.Random(0))
    assert len(chosen) == 3 and all(g in kept for g in chosen)
    assert len({id(g) for g in chosen}) == 3  # without replacement
    assert uniform(groups, 20, random.Random(0)) == groups  # fewer than asked: take all


def test_choosing_takes_what_there_is_and_taking_empties_the_inbox():
    inbox = Inbox(max_groups=10, max_bytes=10**6, max_age_seconds=100)
    for i in range(3):
        inbox.add(group(origin=f"p{i}", index=i), now=0)
    chosen, _ = choose_external("nonzero-uniform", inbox.newest_first(now=0), 4, random.Random(0), SamplerState())
    assert len(chosen) == 3 and len(inbox) == 3  # choosing only reads the inbox
    inbox.take(chosen)
    assert len(inbox) == 0
    assert choose_external("nonzero-uniform", inbox.newest_first(now=0), 4, random.Random(0), SamplerState())[0] == []
