"""Why a peer's failures are kept out of the update by default (docs/science.md: "What sharing does to
the update"): pushing down another policy's wrong answers moves the closing `</answer>` tag,
which they share with the right ones, in contexts this policy would never write and where it is
least sure of the tag; its own right answers cannot push back, because there the tag is already
near certain. In the 4/4 pilot of the study this took every node's format from 1.0 to 0.

The test plays one receiver through ten rounds of such groups: with `off_policy_rows="all"` its
probability of closing the tag after the right answers falls (measured: log p from -0.006 to
-0.06..-0.12 over three seeds), with "positive" it does not (-0.003). The control: the same
groups with failures the receiver sampled itself leave the tag where it was (-0.006..-0.008),
so it is the failures' being another policy's that does it.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from sapo.sampling.external_use import ExternalUse
from sapo.sampling.training_set import training_set
from sapo.training.completions.generation import generate_groups
from sapo.training.config import TrainingSettings
from sapo.training.learning.update import completion_logprobs, grpo_update, make_optimizer
from sapo.training.learning.warmstart import WarmStartSettings, warm_start
from sapo.training.models.policy import load_policy
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs
from tests.support.rows import encode_groups

TASKS = default_task_specs(["basic_arithmetic"])


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> Path:
    """A tiny model that always writes the tag, saved once for the module."""
    torch.set_num_threads(1)
    policy = load_policy("tiny-micro", device="cpu", seed=0, models_dir=tmp_path_factory.mktemp("models"))
    warm_start(policy, TASKS, WarmStartSettings(steps=400, tag_rate=1.0))
    out = tmp_path_factory.mktemp("warm")
    policy.model.save_pretrained(out)
    policy.tokenizer.save_pretrained(out)
    return out


def closing_logprob(policy, problems) -> float:
    """Mean log p of '/' in '<answer>KEY</answer>': the tag closing after the right answer."""
    groups = [
        QuestionGroup(problem=p, completions=[f"<answer>{p.answer}</answer>", "x"], rewards=[1.0, 0.0])
        for p in problems
    ]
    batch = encode_groups(policy, groups, 32)
    rows = [r for r in range(len(batch.completions)) if batch.advantages[r] > 0]
    ids, attention, _ = batch.padded(rows)
    with torch.no_grad():
        logprobs = completion_logprobs(policy.model, ids, attention, batch.width_of(rows))
    slash = [len(f"<answer>{p.answer}<") for p in problems]  # one character, one token
    return float(sum(logprobs[i, k] for i, k in enumerate(slash)) / len(slash))


def peer_group(problem, rng: random.Random) -> QuestionGroup:
    """What another policy wrote: one right answer and seven answers this one would not give."""
    wrong = [f"<answer>{rng.randint(100, 999)}</answer>" for _ in range(7)]
    return QuestionGroup(
        problem=problem,
        completions=[f"<answer>{problem.answer}</answer>", *wrong],
        rewards=[1.0] + [0.0] * 7,
        origin="12D3KooWpeer",
    )


def own_group(policy, problem, seed: int) -> QuestionGroup:
    """The control: the right answer and seven failures this policy sampled itself."""
    (group,) = generate_groups(policy, [problem], num_generations=8, max_new_tokens=24, seed=seed).groups
    return group.model_copy(
        update={
            "completions": [f"<answer>{problem.answer}</answer>", *group.completions[1:]],
            "rewards": [1.0, *group.rewards[1:]],
        }
    )


@pytest.mark.parametrize(
    "failures, off_policy_rows, falls",
    [
        ("peer", "all", True),
        ("peer", "positive", False),
        ("own", "all", False),
        ("peer", None, False),  # the node's defaults keep the tag (they did not before "positive" was the default)
    ],
)
def test_a_peers_failures_push_the_closing_tag_down(warm, failures, off_policy_rows, falls):
    torch.manual_seed(0)
    policy = load_policy("tiny-micro", device="cpu", seed=0, models_dir=warm, weights_from=warm)
    use = ExternalUse() if off_policy_rows is None else ExternalUse(off_policy_rows=off_policy_rows)
    settings = TrainingSettings(lr=3e-4, max_new_tokens=24)  # the defaults: 2 passes x 2 minibatches
    optimizer = make_optimizer(policy, settings)
    probe = TaskSampler(TASKS, dataset_seed=7, rng_seed=7).sample(32)
    before = closing_logprob(policy, probe)
    sampler, rng = TaskSampler(TASKS, dataset_seed=1, rng_seed=1), random.Random(0)
    for step in range(10):
        problems = sampler.sample(4)
        groups = [
            peer_group(p, rng) if failures == "peer" else own_group(policy, p, 100 * step + i)
            for i, p in enumerate(problems)
        ]
        grpo_update(policy, optimizer, training_set(groups, [], use, policy.tokenizer_fingerprint).rows, settings, rng)
    after = closing_logprob(policy, probe)
    if falls:
        assert after < before - 0.03, (before, after)
    else:
        assert after > before - 0.01, (before, after)


@pytest.mark.parametrize(
    ("own_rows", "off_policy_rows"),
    [("all", "all"), ("all", "positive"), ("positive", "all"), ("positive", "positive")],
)
def test_which_rows_train_by_whose_they_are_and_their_sign(own_rows, off_policy_rows):
    problem = TaskSampler(TASKS, 1, 0).sample(1)[0]
    texts = ["<answer>right</answer>", "<answer>wrong</answer>"]
    own = QuestionGroup(problem=problem, completions=texts, rewards=[1.0, 0.0])
    peer = own.model_copy(update={"origin": "12D3KooWpeer"})
    assert not peer.is_local and own.is_local
    use = ExternalUse(own_rows=own_rows, off_policy_rows=off_policy_rows)
    kept = lambda group: [row.completion for row in training_set([group], [], use, "").rows.rows]  # noqa: E731
    # a right answer (positive advantage) always trains; a wrong one only where that side says "all"
    assert kept(own) == (texts if own_rows == "all" else texts[:1])
    assert kept(peer) == (texts if off_policy_rows == "all" else texts[:1])
