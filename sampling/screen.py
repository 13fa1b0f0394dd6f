"""The screen in front of training: a peer's group trains only if the text of its winning
completions is text this node's own policy could have written.

A right answer says nothing about the words around it ("Hail to the Thief", arXiv 2511.09780:
out-of-context and in-context poisoning of decentralised GRPO). Here each completion's tokens are
measured by their excess surprise under this node's policy (training/typicality.py: surprise
minus the policy's own entropy, 0 on average over its own samples), summed over the worst stretch
of `screen_window` tokens outside the answer. The bar is set by this node's own completions: the
99th percentile of that statistic over its last REFERENCE_SIZE completions, plus a margin. So the
bar moves with the policy as it trains, and a peer on another model is held to the same bar.

Only completions that would train count (those above their group's mean reward: the default
trains a peer's completion only when its advantage is positive); a group with any of them over
the bar is refused whole, and its author's standing pays for it (standing.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from sapo.sampling.trust import TrustSettings
from sapo.training.rollouts import QuestionGroup

# Own completions the bar is drawn from: 8-16 rounds of make run's 2-4 groups of 8.
REFERENCE_SIZE = 256
QUANTILE = 0.99
# Before a node has seen any completion of its own (I = 0), the bar is the margin over this:
# the statistic of a policy's own samples averages 0 per token, a window's worth sits near a few nats.
PRIOR_BAR = 8.0


def worst_stretch(excess: list[float], window: int) -> float:
    """The largest sum of `window` consecutive values (all of them, if fewer)."""
    if len(excess) <= window:
        return sum(excess)
    total = best = sum(excess[:window])
    for i in range(window, len(excess)):
        total += excess[i] - excess[i - window]
        best = max(best, total)
    return best


class ScreenReference(BaseModel):
    """The statistic of this node's own recent completions, newest last: what the bar is drawn from.
    Carried in the node's state and its checkpoints."""

    model_config = ConfigDict(frozen=True)

    own: tuple[float, ...] = ()

    def updated(self, values: list[float]) -> "ScreenReference":
        return ScreenReference(own=(*self.own, *values)[-REFERENCE_SIZE:])

    def bar(self, margin: float) -> float:
        if not self.own:
            return PRIOR_BAR + margin
        ordered = sorted(self.own)
        return ordered[min(len(ordered) - 1, int(QUANTILE * len(ordered)))] + margin


@dataclass(frozen=True)
class ScreenVerdict:
    kept: list[QuestionGroup]
    refused: list[QuestionGroup]
    reference: ScreenReference  # with this round's own completions
    bar: float
    scores: list[float]  # the statistic of every judged external completion, in order


def judged(group: QuestionGroup) -> list[int]:
    """The completions of a peer's group that would train: those above the group's mean reward."""
    mean = sum(group.rewards) / len(group.rewards) if group.rewards else 0.0
    return [i for i, r in enumerate(group.rewards) if r > mean]


def screen(
    external: list[QuestionGroup],
    external_excess: list[list[list[float]]],
    own_excess: list[list[list[float]]],
    reference: ScreenReference,
    trust: TrustSettings,
) -> ScreenVerdict:
    """Keep the external groups whose judged completions all stay under the bar that this node's
    own completions (this round's included) set."""
    window = trust.screen_window
    reference = reference.updated([worst_stretch(z, window) for group in own_excess for z in group])
    bar = reference.bar(trust.screen_margin)
    kept, refused, scores = [], [], []
    for group, excess in zip(external, external_excess, strict=True):
        worst = [worst_stretch(excess[i], window) for i in judged(group)]
        scores += worst
        (refused if any(s > bar for s in worst) else kept).append(group)
    return ScreenVerdict(kept, refused, reference, bar, scores)
