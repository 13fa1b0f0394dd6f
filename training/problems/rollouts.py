"""The units that flow through a round: one question and its G decoded completions, and the
rows an update trains on."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from sapo.training.problems.tasks import Problem

LOCAL_ORIGIN = "local"


class Behavior(BaseModel):
    """The sampling policy's own log-probability of each token it sampled, per completion, with
    the tokenizer (a fingerprint) and temperature they belong to."""

    model_config = ConfigDict(frozen=True)

    tokenizer: str
    temperature: float
    token_logprobs: list[list[float]]


class QuestionGroup(BaseModel):
    """One question with G completions as plain text.

    `rewards` are always this node's own verifier scores: a peer's rewards never get here.
    `origin` is "local" for this node's rollouts, else the sender's peer id.
    """

    model_config = ConfigDict(frozen=True)

    problem: Problem
    completions: list[str]
    rewards: list[float]
    origin: str = LOCAL_ORIGIN
    model_id: str = ""
    sender_round: int = Field(default=0, ge=0)
    created_at: float = 0.0
    # Per completion: was it sampled by this node's own policy? None means all of them for a local
    # group and none for a peer's; a peer's group that this node augmented with its own samples
    # (sampling/training_set.py, `augmented`) holds both.
    on_policy: list[bool] | None = None
    # What the policy that sampled the completions thought of them, when it said (local groups,
    # and a peer's that shared it): lets an off-policy completion be importance-weighted.
    behavior: Behavior | None = None

    @property
    def is_local(self) -> bool:
        return self.origin == LOCAL_ORIGIN

    def on_policy_rows(self) -> list[bool]:
        return list(self.on_policy) if self.on_policy is not None else [self.is_local] * len(self.completions)


@dataclass(frozen=True)
class TrainingRow:
    """One completion as the update trains on it, in text: this node's tokenizer encodes it."""

    question: int  # index into TrainingRows.problems; a question's rows train in the same minibatch
    completion: str
    advantage: float  # over the completion's whole group
    # The sampling policy's log-prob of each token, for a row another policy sampled with our
    # tokenizer at temperature 1: the update weighs such a row by min(1, p_ours / p_sender).
    behavior: tuple[float, ...] | None = None


@dataclass(frozen=True)
class TrainingRows:
    """What one GRPO update trains on: the questions, and the rows of each, in order."""

    problems: list[Problem]
    rows: list[TrainingRow]
