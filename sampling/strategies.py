"""Small swappable strategies: which received groups are eligible, and how J are drawn.

A sampler is a plain function (candidates newest-first, J, rng) -> chosen groups.
"""

from __future__ import annotations

import random
from typing import Callable

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


SAMPLERS: dict[str, Sampler] = {
    "nonzero-uniform": nonzero_uniform,
    "uniform": uniform,
}


def get_sampler(name: str) -> Sampler:
    try:
        return SAMPLERS[name]
    except KeyError:
        raise ValueError(f"unknown sampler {name!r}; choose from {', '.join(SAMPLERS)}") from None
