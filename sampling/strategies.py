"""Small swappable strategies: which received groups are eligible, and how J are drawn.

A sampler is a plain function (candidates newest-first, J, rng) -> chosen groups. The one
that learns from what it sees (`peer-weighted`) takes and returns its state as a value,
`SamplerState`, which the round carries and the checkpoint keeps.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable, Mapping

from pydantic import BaseModel, ConfigDict

from sapo.sampling.external_use import SamplerName
from sapo.sampling.training_set import has_full_credit
from sapo.training.learning.grpo import has_signal
from sapo.training.problems.rollouts import QuestionGroup

# (candidates newest first, J, rng, author weights or None) -> chosen
Sampler = Callable[[list[QuestionGroup], int, random.Random, Mapping[str, float] | None], list[QuestionGroup]]

# How much a peer-weighted sampler remembers. A group is offered again every round while it
# stays in the inbox, and is counted once: remembering the last few thousand groups covers an
# inbox of the default 512 many times over. Past the peer limit the peer seen longest ago goes.
SEEN_LIMIT = 4096
PEER_LIMIT = 1024


def drop_zero_advantage(groups: list[QuestionGroup]) -> list[QuestionGroup]:
    """Groups whose recomputed rewards are all equal have all-zero advantages: no signal."""
    return [g for g in groups if has_signal(g.rewards)]


def uniform(
    candidates: list[QuestionGroup], count: int, rng: random.Random, weights: Mapping[str, float] | None = None
) -> list[QuestionGroup]:
    """Without replacement; fewer than `count` candidates means take them all. Uniformly over
    groups, or with `weights` (author -> weight: its standing, sampling/standing.py) each draw
    picks an author by weight, then one of its groups uniformly: an author's share of what this
    node trains on follows its standing, not how many groups (or keys) it sends."""
    if count <= 0 or not candidates:
        return []
    if len(candidates) <= count:
        return list(candidates)
    if weights is None:
        return rng.sample(candidates, count)
    by_author: dict[str, list[QuestionGroup]] = {}
    for group in candidates:
        by_author.setdefault(group.origin, []).append(group)
    chosen: list[QuestionGroup] = []
    while len(chosen) < count:
        authors = list(by_author)
        author = rng.choices(authors, weights=[weights.get(a, 0.0) + 1e-12 for a in authors], k=1)[0]
        pool = by_author[author]
        chosen.append(pool.pop(rng.randrange(len(pool))))
        if not pool:
            del by_author[author]
    return chosen


def nonzero_uniform(
    candidates: list[QuestionGroup], count: int, rng: random.Random, weights=None
) -> list[QuestionGroup]:
    """The paper's controlled run: drop zero-advantage groups, then sample uniformly."""
    return uniform(drop_zero_advantage(candidates), count, rng, weights)


def has_correct(candidates: list[QuestionGroup], count: int, rng: random.Random, weights=None) -> list[QuestionGroup]:
    """Only mixed groups in which some completion earns full marks from our own verifier.

    A correct outside answer is the knowledge worth importing; groups whose best answer is
    partial-credit junk ("18" for "8") are what made positive-only filtering backfire.
    """
    return uniform([g for g in drop_zero_advantage(candidates) if has_full_credit(g)], count, rng, weights)


def any_correct(candidates: list[QuestionGroup], count: int, rng: random.Random, weights=None) -> list[QuestionGroup]:
    """Groups holding a fully correct answer, all-correct ones included: the sampler for
    receiver-augmented groups (--augment-external), where this node's own failures supply the
    contrast that an all-correct group lacks."""
    return uniform([g for g in candidates if has_full_credit(g)], count, rng, weights)


SAMPLERS: dict[str, Sampler] = {
    "nonzero-uniform": nonzero_uniform,
    "uniform": uniform,
    "has-correct": has_correct,
    "any-correct": any_correct,
}


class SamplerState(BaseModel):
    """What the peer-weighted sampler has learnt: each peer's usefulness, an exponential moving
    average over the groups it offered of "this group has signal and a fully correct answer"
    (by our own verifier), and which groups it has already counted. Bounded (SEEN_LIMIT,
    PEER_LIMIT); the other samplers keep it empty."""

    model_config = ConfigDict(frozen=True)

    usefulness: dict[str, float] = {}
    seen: list[str] = []


class PeerWeighted:
    """Draw groups with probability proportional to their sender's usefulness so far. Every
    peer keeps a floor weight, so a peer that improves is noticed again."""

    decay = 0.9
    floor = 0.05
    prior = 0.5

    @classmethod
    def observe(cls, state: SamplerState, candidates: list[QuestionGroup]) -> SamplerState:
        usefulness, seen = dict(state.usefulness), list(state.seen)
        known = set(seen)
        for group in candidates:
            key = seen_key(group)
            if key in known:
                continue  # groups that stay in the inbox are offered again; count each once
            known.add(key)
            seen.append(key)
            useful = float(has_signal(group.rewards) and has_full_credit(group))
            old = usefulness.pop(group.origin, cls.prior)  # re-inserted: the dict's order is recency
            usefulness[group.origin] = cls.decay * old + (1 - cls.decay) * useful
        while len(usefulness) > PEER_LIMIT:
            del usefulness[next(iter(usefulness))]
        return SamplerState(usefulness=usefulness, seen=seen[-SEEN_LIMIT:])

    @classmethod
    def choose(
        cls,
        candidates: list[QuestionGroup],
        count: int,
        rng: random.Random,
        state: SamplerState,
        author_weights: Mapping[str, float] | None = None,
    ) -> list[QuestionGroup]:
        pool = drop_zero_advantage(candidates)
        chosen: list[QuestionGroup] = []
        while pool and len(chosen) < count:
            held = Counter(g.origin for g in pool)  # standing is per author, shared by its groups
            weights = [
                (cls.floor + state.usefulness.get(g.origin, cls.prior))
                * (1.0 if author_weights is None else (author_weights.get(g.origin, 0.0) + 1e-12) / held[g.origin])
                for g in pool
            ]
            pick = rng.choices(range(len(pool)), weights=weights, k=1)[0]
            chosen.append(pool.pop(pick))
        return chosen


def seen_key(group: QuestionGroup) -> str:
    """The key under which the peer-weighted sampler remembers a group it has counted
    (`SamplerState.seen`, kept in checkpoints, so it survives a restart, which Python's own hash
    of text does not). Not the wire's group digest (protocol/wire/codec.py's `group_digest`, which
    names a group on the wire): this one also tells a group's round apart, and its bytes are what
    saved sampler states hold."""
    text = "\x1f".join([group.origin, group.problem.spec.key(), str(group.sender_round), *group.completions])
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def choose_external(
    name: SamplerName,
    candidates: list[QuestionGroup],
    count: int,
    rng: random.Random,
    state: SamplerState,
    author_weights: Mapping[str, float] | None = None,
) -> tuple[list[QuestionGroup], SamplerState]:
    """J of the candidates by the named sampler, and the sampler's state after seeing them.
    `author_weights`: each author's weight (its standing, sampling/standing.py), or None (standing off) to weigh every group alike."""
    if name == "peer-weighted":
        state = PeerWeighted.observe(state, candidates)
        return PeerWeighted.choose(candidates, count, rng, state, author_weights), state
    try:
        return SAMPLERS[name](candidates, count, rng, author_weights), state
    except KeyError:
        raise ValueError(f"unknown sampler {name!r}; choose from {', '.join([*SAMPLERS, 'peer-weighted'])}") from None
