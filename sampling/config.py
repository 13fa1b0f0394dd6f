"""Settings owned by the sampling layer: the I/J mix and the inbox bounds."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The strategies in strategies.py, by name; named here so settings are checked without torch.
SamplerName = Literal["nonzero-uniform", "uniform", "has-correct", "any-correct", "peer-weighted"]


class SamplingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    local: int = Field(default=4, ge=0, le=256, description="I: local question groups generated and trained on per round")
    external: int = Field(default=4, ge=0, le=256, description="J: external question groups from peers trained on per round")
    balance: Literal["fixed", "adaptive"] = Field(
        default="adaptive",
        description="adaptive: the node moves its own J (I + J fixed, starting at J) by comparing the reward "
        "gain after rounds with more and with fewer external groups (the studies' winner); fixed: always I/J. "
        "Unless given, a node with --local 0 or --external 0 is fixed: it keeps the split it was asked for",
    )
    balance_period: int = Field(default=10, ge=2, le=10_000, description="rounds between adaptive-balance decisions")
    sampler: SamplerName = Field(
        default="nonzero-uniform",
        description="how external groups are chosen: nonzero-uniform (drop all-zero-advantage groups, "
        "then uniform; the paper's controlled run), uniform (all received groups; the open demo), "
        "has-correct (mixed groups holding a fully correct answer), any-correct (groups holding a fully correct "
        "answer, all-correct ones too: for --augment-external) or peer-weighted (favour peers whose "
        "past groups were useful)",
    )
    external_credit: Literal["partial", "exact"] = Field(
        default="partial",
        description="how a peer's completions are scored: partial (the task's own score, partial credit included) "
        "or exact (1 only for a fully correct answer)",
    )
    augment_external: int = Field(
        default=0,
        ge=0,
        le=64,
        description="receiver-augmented groups: sample this many completions of our own for each external "
        "question and compute advantages over the union (0 = off)",
    )
    inbox_max_groups: int = Field(default=512, ge=1, le=1_000_000, description="inbox cap on question groups")
    inbox_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, description="inbox cap on stored text, bytes")
    inbox_max_age_seconds: float = Field(default=600.0, gt=0, description="groups older than this are evicted")
    inbox_peer_share: float = Field(
        default=0.25, gt=0, le=1.0, description="most of the inbox one peer may hold; its oldest groups make way"
    )

    @model_validator(mode="after")
    def _can_train(self) -> "SamplingSettings":
        if self.local == 0 and self.external == 0:
            raise ValueError("--local 0 with --external 0 trains on nothing: give --local (I) at least 1")
        if self.local == 0 or self.external == 0:
            # an isolated node (J = 0) or one that trains on peers' groups only (I = 0) asked for that split
            self.keep_the_asked_split()
        if self.balance == "adaptive" and self.local == 0:
            raise ValueError("--balance adaptive keeps at least one local group a round: give --local at least 1")
        return self

    def keep_the_asked_split(self) -> None:
        """Fix the balance at I/J, unless --balance was given: the default balance is adaptive, and
        moving J would override a split the node was asked to keep. Assigned without marking the
        field as given, so a copy re-validates the same way."""
        if "balance" not in self.model_fields_set:
            object.__setattr__(self, "balance", "fixed")
