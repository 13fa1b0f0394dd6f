"""The one pure step between choosing a round's groups and training on them: a node's
`ExternalUse` applied to the external groups it took, then the rows every group trains.

- Exact credit: a peer's completion earns 1 only for a fully correct answer. Partial credit
  ("18" for 8 scores 0.5 in basic_arithmetic) makes a peer's near-misses look like signal.
- Receiver-augmented groups: this node adds k completions of its own to a peer's question and
  the advantages are computed over the union. A correct outside answer then earns an advantage
  against this node's own failures, so a group the peer got all right, which carries exactly
  the knowledge this node lacks and has no signal on its own, becomes useful.
- Which rows train: a completion this node did not sample itself trains only when its
  advantage is positive (by default; `off_policy_rows`). Its failures are what another policy
  wrote: pushing them down moves tokens they share with good answers (the `</answer>` tag) in
  contexts this policy would not produce, where it is least sure of them, and that push is not
  balanced by its own successes, on which those tokens are already near certain.
- Importance weights: an off-policy row keeps its sender's token log-probs (when they are
  comparable with ours), and the update weighs it by them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sapo.sampling.external_use import ExternalUse
from sapo.sampling.screen import ScreenReference
from sapo.training.learning.grpo import group_advantages, has_signal
from sapo.training.problems.rewards import is_correct
from sapo.training.problems.rollouts import QuestionGroup, TrainingRow, TrainingRows
from sapo.training.problems.tasks import Problem


@dataclass(frozen=True)
class TrainingSet:
    """A round's groups as the update sees them, with the rows they train."""

    local: list[QuestionGroup]
    external: list[QuestionGroup]  # as prepared: credit applied, our own completions added
    rows: TrainingRows
    augment_tokens: int = 0  # tokens this node generated for external questions (--augment-external)
    refused: list[QuestionGroup] = field(default_factory=list)  # chosen, then refused by the screen
    screened_completions: int = 0  # completions the screen dropped from groups it kept
    screen: ScreenReference | None = None  # the screen's reference after this round, when it ran
    screen_seconds: float = 0.0  # what screening the external groups took
    redrawn: int = 0  # external groups drawn again in place of groups the screen refused


def training_set(
    local: list[QuestionGroup],
    external: list[QuestionGroup],
    use: ExternalUse,
    tokenizer: str,
    own: list[QuestionGroup] | None = None,
    augment_tokens: int = 0,
) -> TrainingSet:
    """The round's training set. `own`: this node's completions for each external question, in
    the same order, when it augments; `tokenizer`: this node's tokenizer fingerprint, which a
    sender's log-probs must share to be compared with ours."""
    if own:
        external = [augmented(group, ours) for group, ours in zip(external, own, strict=True)]
    if use.external_credit == "exact":
        external = [with_exact_credit(group) for group in external]
    problems: list[Problem] = []
    rows: list[TrainingRow] = []
    for group in [*local, *external]:
        if not has_signal(group.rewards):
            continue  # all-equal rewards: zero advantages, nothing to learn
        question = [
            TrainingRow(len(problems), text, advantage, _behavior(group, index, use, tokenizer))
            for index, text, advantage in _trained(group, use)
        ]
        if question:
            problems.append(group.problem)
            rows += question
    return TrainingSet(list(local), external, TrainingRows(problems, rows), augment_tokens)


def _trained(group: QuestionGroup, use: ExternalUse) -> list[tuple[int, str, float]]:
    """(index, completion, advantage) of the rows a group trains; advantages over the whole group."""
    advantages = group_advantages(torch.tensor(group.rewards)).tolist()
    rows = zip(range(len(group.completions)), group.completions, advantages, group.on_policy_rows())
    return [
        (index, text, advantage)
        for index, text, advantage, own in rows
        if advantage > 0 or (use.own_rows if own else use.off_policy_rows) == "all"
    ]


def _behavior(group: QuestionGroup, index: int, use: ExternalUse, tokenizer: str) -> tuple[float, ...] | None:
    """The sender's log-probs of completion `index`, where they weigh it: an off-policy row,
    sampled with our tokenizer at temperature 1 (ours are at temperature 1), under
    `importance_weight`."""
    behavior = group.behavior
    if use.importance_weight == "off" or behavior is None or group.on_policy_rows()[index]:
        return None
    if behavior.tokenizer != tokenizer or behavior.temperature != 1.0:
        return None
    return tuple(behavior.token_logprobs[index]) or None


def with_exact_credit(group: QuestionGroup) -> QuestionGroup:
    return group.model_copy(update={"rewards": [1.0 if is_correct(r) else 0.0 for r in group.rewards]})


def augmented(external: QuestionGroup, own: QuestionGroup) -> QuestionGroup:
    """The peer's completions and this node's own for the same question, as one group."""
    if own.problem.spec != external.problem.spec:
        raise ValueError("augmenting a group with completions of another question")
    behavior = external.behavior
    if behavior is not None:  # our own rows are on-policy and need no weight
        behavior = behavior.model_copy(
            update={"token_logprobs": [*behavior.token_logprobs, *([[]] * len(own.completions))]}
        )
    return external.model_copy(
        update={
            "completions": [*external.completions, *own.completions],
            "rewards": [*external.rewards, *own.rewards],
            "on_policy": [*external.on_policy_rows(), *([True] * len(own.completions))],
            "behavior": behavior,
        }
    )


def has_full_credit(group: QuestionGroup) -> bool:
    return any(map(is_correct, group.rewards))
