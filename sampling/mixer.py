"""The round's training set: I local groups plus up to J external ones. Never waits for peers."""

from __future__ import annotations

import random
from dataclasses import dataclass

from sapo.sampling.inbox import Inbox
from sapo.sampling.strategies import Sampler
from sapo.training.rollouts import QuestionGroup


@dataclass(frozen=True)
class TrainingSet:
    local: list[QuestionGroup]
    external: list[QuestionGroup]
    augment_tokens: int = 0  # tokens this node generated for external questions (--augment-external)

    @property
    def groups(self) -> list[QuestionGroup]:
        return self.local + self.external


def mix(
    local: list[QuestionGroup],
    inbox: Inbox,
    external_count: int,
    sampler: Sampler,
    rng: random.Random,
    now: float,
    window: int | None = None,
) -> TrainingSet:
    """Take the newest eligible inbox groups (at most `window` of them), then let the sampler
    choose `external_count`. With fewer candidates it trains on what it has."""
    candidates = inbox.newest_first(now)
    if window is not None:
        candidates = candidates[:window]
    external = sampler(candidates, external_count, rng)
    inbox.take(external)
    return TrainingSet(local=list(local), external=external)
