"""The unit that flows through a round: one question and its G decoded completions."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sapo.training.tasks import Problem

LOCAL_ORIGIN = "local"


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

    @property
    def is_local(self) -> bool:
        return self.origin == LOCAL_ORIGIN
