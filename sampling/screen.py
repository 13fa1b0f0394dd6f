"""The screen in front of training: a peer's group trains only if the text of its winning
completions is text this node's own policy could have written.

A right answer says nothing about the words around it ("Hail to the Thief", arXiv 2511.09780:
out-of-context and in-context poisoning of decentralised GRPO). Here each completion's tokens are
measured by their excess surprise under this node's policy (training/learning/typicality.py: surprise
minus the policy's own entropy, 0 on average over its own samples), summed over the worst stretch
of `screen_window` tokens outside the answer. The bar is set by this node's own completions of the
same kind: the 99th percentile of that statistic over its last REFERENCE_SIZE winning completions
(`winning`), plus a margin. So the bar moves with the policy as it trains, and a peer on another
model is held to the same bar.

Only completions that would train are judged (those above their group's mean reward: the
default trains a peer's completion only when its advantage is positive), at most the node's own G
of them a group; a group's winners past those are dropped unmeasured, so a peer's group costs
what one of the node's own would to screen. One over the bar is
dropped from its group; a group whose every judged completion is over it is refused whole. Every
judged group's dropped share (`ScreenVerdict.dropped_shares`) goes against its author's standing
(standing.py), so one clean winner cannot launder the rest, and probing the bar costs the
prober. So an attacker who slips its text into one right answer of a group loses that answer
and some standing, and one who writes it into all of them loses the group and more, while an
honest peer's rare stray completion costs it one row and a little standing, not its
group (make run's SmolLM2 peers: 10 of 73 groups refused when any one completion refused its group). Like is compared
with like: a model's failures ramble (SmolLM2's wrong or unfinished answers reach 30 nats over a
stretch, bench/screen_roc.py), its right answers are terse, and a bar drawn from all its own
completions let every attack on SmolLM2 through.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from sapo.sampling.trust import TrustSettings
from sapo.training.problems.rollouts import QuestionGroup

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

    def updated(self, values: list[float]) -> ScreenReference:
        return ScreenReference(own=(*self.own, *values)[-REFERENCE_SIZE:])

    def bar(self, margin: float) -> float:
        if not self.own:
            return PRIOR_BAR + margin
        ordered = sorted(self.own)
        return ordered[min(len(ordered) - 1, int(QUANTILE * len(ordered)))] + margin


@dataclass(frozen=True)
class ScreenVerdict:
    kept: list[QuestionGroup]  # less the completions over the bar
    refused: list[QuestionGroup]  # every judged completion over the bar
    reference: ScreenReference  # with this round's own completions
    bar: float
    scores: list[float]  # the statistic of every judged external completion, in order
    dropped: int = 0  # completions over the bar in groups that were kept
    # per external group, in order: the share of its judged completions over the bar (1.0:
    # refused), or None for a group with none judged
    dropped_shares: list[float | None] = field(default_factory=list)


def winners(group: QuestionGroup, augmented: bool = False) -> list[int]:
    """The completions of a peer's group that would train: those above the group's mean reward;
    or, where this node adds its own completions to the group (`augmented`, --augment-external),
    every one with a reward, since against this node's own failures any of them can win (an
    all-right group has none above its own mean)."""
    mean = sum(group.rewards) / len(group.rewards) if group.rewards and not augmented else 0.0
    return [i for i, r in enumerate(group.rewards) if r > mean]


def judged(group: QuestionGroup, augmented: bool = False, most: int | None = None) -> list[int]:
    """The winners the screen measures: the first `most` of them (all, if None). A peer's group
    may hold 64 completions, 63 of them long winners, about 200 times what an honest group of 8
    costs to screen (tests/screen_attacks/); the rest of its winners are dropped unmeasured."""
    return winners(group, augmented)[:most]


def winning(groups: list[QuestionGroup], augmented: bool = False, most: int | None = None) -> list[QuestionGroup]:
    """Each group with only its judged completions: this node's own of the kind the screen judges."""
    picked = [(g, judged(g, augmented, most)) for g in groups]
    return [
        g.model_copy(
            update={
                "completions": [g.completions[i] for i in idx],
                "rewards": [g.rewards[i] for i in idx],
                "behavior": None,
                "on_policy": None,
            }
        )
        for g, idx in picked
    ]


def without(group: QuestionGroup, drop: list[int]) -> QuestionGroup:
    """The group less the completions at `drop`."""
    if not drop:
        return group
    keep = [i for i in range(len(group.completions)) if i not in set(drop)]
    behavior = group.behavior
    if behavior is not None:
        behavior = behavior.model_copy(update={"token_logprobs": [behavior.token_logprobs[i] for i in keep]})
    on_policy = group.on_policy_rows()
    return group.model_copy(
        update={
            "completions": [group.completions[i] for i in keep],
            "rewards": [group.rewards[i] for i in keep],
            "on_policy": [on_policy[i] for i in keep] if group.on_policy is not None else None,
            "behavior": behavior,
        }
    )


def screen(
    external: list[QuestionGroup],
    judged_excess: list[list[list[float]]],
    own_excess: list[list[list[float]]],
    reference: ScreenReference,
    trust: TrustSettings,
    augmented: bool = False,
    most: int | None = None,
) -> ScreenVerdict:
    """Screen the external groups by their judged completions (`judged_excess`: the excess
    surprise of each group's `judged` completions, in order; `winning` of the groups measures
    just those) against the bar that this node's own winning completions (`own_excess`; this
    round's included) set."""
    window = trust.screen_window
    reference = reference.updated([worst_stretch(z, window) for group in own_excess for z in group])
    bar = reference.bar(trust.screen_margin)
    kept, refused, scores, dropped, shares = [], [], [], 0, []
    for group, excess in zip(external, judged_excess, strict=True):
        measured = judged(group, augmented, most)
        unmeasured = winners(group, augmented)[len(measured) :]  # past `most`: never trained
        worst = [worst_stretch(z, window) for z in excess]
        scores += worst
        over = [i for i, score in zip(measured, worst, strict=True) if score > bar]
        shares.append(len(over) / len(measured) if measured else None)
        if over and len(over) == len(measured):
            refused.append(group)
        else:
            kept.append(without(group, over + unmeasured))
            dropped += len(over)
    return ScreenVerdict(kept, refused, reference, bar, scores, dropped, shares)
