"""How a peer's groups are prepared for this node's update, after the sampler has chosen them.

- Exact credit: a peer's completion earns 1 only for a fully correct answer. Partial credit
  ("18" for 8 scores 0.5 in basic_arithmetic) makes a peer's near-misses look like signal.
- Receiver-augmented groups: this node adds k completions of its own to a peer's question and
  the advantages are computed over the union. A correct outside answer then earns an advantage
  against this node's own failures, so a group the peer got all right, which carries exactly
  the knowledge this node lacks and has no signal on its own, becomes useful.
"""

from __future__ import annotations

from sapo.training.rollouts import QuestionGroup

FULL_CREDIT = 1.0


def with_exact_credit(group: QuestionGroup) -> QuestionGroup:
    return group.model_copy(update={"rewards": [1.0 if r >= FULL_CREDIT else 0.0 for r in group.rewards]})


def augmented(external: QuestionGroup, own: QuestionGroup) -> QuestionGroup:
    """The peer's completions and this node's own for the same question, as one group."""
    if own.problem.spec != external.problem.spec:
        raise ValueError("augmenting a group with completions of another question")
    behavior = external.behavior
    if behavior is not None:  # our own rows are on-policy and need no weight
        behavior = behavior.model_copy(update={"token_logprobs": [*behavior.token_logprobs, *([[]] * len(own.completions))]})
    return external.model_copy(
        update={
            "completions": [*external.completions, *own.completions],
            "rewards": [*external.rewards, *own.rewards],
            "on_policy": [*external.on_policy_rows(), *([True] * len(own.completions))],
            "behavior": behavior,
        }
    )


def has_full_credit(group: QuestionGroup) -> bool:
    return max(group.rewards, default=0.0) >= FULL_CREDIT
