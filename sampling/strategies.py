"""Small swappable strategies: which received groups are eligible, and how J are drawn.

A sampler is a plain function (candidates newest-first, J, rng) -> chosen groups.
"""

from __future__ import annotations

import random
from typing import Callable

from sapo.sampling.config import SamplerName
from sapo.sampling.external import has_full_credit
from sapo.training.grpo import has_signal
from sapo.training.rollouts import QuestionGroup

Sampler = Callable[[list[QuestionGroup], int, random.Random], list[QuestionGroup]]


def drop_zero_advantage(groups: list[QuestionGroup]) -> list[QuestionGroup]:
    """Groups whose recomputed rewards are all equal have all-zero advantages: no signal."""
    return [g for g in groups if has_signal(g.rewards)]


def uniform(candidates: list[QuestionGroup], count: int, rng: random.Random) -> list[QuestionGroup]:
    """Uniformly without replacement; fewer than `count` candidates means take them all."""
    if count <= 0 or not candidates:
        return []
    if len(candidates) <= count:
        return list(candidates)
    return rng.sample(candidates, count)


def nonzero_uniform(candidates: list[QuestionGroup], count: int, rng: random.Random) -> list[QuestionGroup]:
    """The paper's controlled run: drop zero-advantage groups, then sample uniformly."""
    return uniform(drop_zero_advantage(candidates), count, rng)


def has_correct(candidates: list[QuestionGroup], count: int, rng: random.Random) -> list[QuestionGroup]:
    """Only mixed groups in which some completion earns full marks from our own verifier.

    A correct outside answer is the knowledge worth importing; groups whose best answer is
    partial-credit junk ("18" for "8") are what made positive-only filtering backfire.
    """
    return uniform([g for g in drop_zero_advantage(candidates) if has_full_credit(g)], count, rng)


def any_correct(candidates: list[QuestionGroup], count: int, rng: random.Random) -> list[QuestionGroup]:
    """Groups holding a fully correct answer, all-correct ones included: the sampler for
    receiver-augmented groups (--augment-external), where this node's own failures supply the
    contrast that an all-correct group lacks."""
    return uniform([g for g in candidates if has_full_credit(g)], count, rng)


class PeerWeighted:
    """Draw groups with probability proportional to their sender's usefulness so far.

    A peer's usefulness is an exponential moving average, over the groups it has offered, of
    "this group has signal and contains a fully correct answer" (by our own verifier). Every peer
    keeps a floor weight, so a peer that improves is noticed again. Stateful: one per node.
    """

    def __init__(self, decay: float = 0.9, floor: float = 0.05, prior: float = 0.5):
        self.decay = decay
        self.floor = floor
        self.prior = prior
        self.usefulness: dict[str, float] = {}
        self._seen: set[tuple[str, str, int, int]] = set()

    def observe(self, group: QuestionGroup) -> None:
        key = (group.origin, group.problem.spec.key(), group.sender_round, hash(tuple(group.completions)))
        if key in self._seen:
            return  # groups that stay in the inbox are offered again; count each once
        self._seen.add(key)
        useful = float(has_signal(group.rewards) and has_full_credit(group))
        old = self.usefulness.get(group.origin, self.prior)
        self.usefulness[group.origin] = self.decay * old + (1 - self.decay) * useful

    def __call__(self, candidates: list[QuestionGroup], count: int, rng: random.Random) -> list[QuestionGroup]:
        for g in candidates:
            self.observe(g)
        pool = drop_zero_advantage(candidates)
        chosen: list[QuestionGroup] = []
        while pool and len(chosen) < count:
            weights = [self.floor + self.usefulness.get(g.origin, self.prior) for g in pool]
            pick = rng.choices(range(len(pool)), weights=weights, k=1)[0]
            chosen.append(pool.pop(pick))
        return chosen


SAMPLERS: dict[str, Sampler] = {
    "nonzero-uniform": nonzero_uniform,
    "uniform": uniform,
    "has-correct": has_correct,
    "any-correct": any_correct,
}

# Samplers that learn from what they see: a fresh instance per node.
STATEFUL_SAMPLERS: dict[str, Callable[[], Sampler]] = {
    "peer-weighted": PeerWeighted,
}


def get_sampler(name: SamplerName) -> Sampler:
    if name in STATEFUL_SAMPLERS:
        return STATEFUL_SAMPLERS[name]()
    try:
        return SAMPLERS[name]
    except KeyError:
        names = [*SAMPLERS, *STATEFUL_SAMPLERS]
        raise ValueError(f"unknown sampler {name!r}; choose from {', '.join(names)}") from None
