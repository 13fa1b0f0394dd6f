"""Settings owned by the sampling layer: the I/J mix, its balance and the inbox bounds. How
external groups are used is the `ExternalUse` value (external_use.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sapo.sampling.balance import AdaptiveBalance, Balance, FixedBalance


class SamplingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    local: int = Field(
        default=4, ge=0, le=256, description="I: local question groups generated and trained on per round"
    )
    external: int = Field(default=4, ge=0, le=256, description="J: external groups from peers trained on per round")
    balance: Literal["auto", "fixed", "adaptive"] = Field(
        default="auto",
        description="fixed: always I/J; adaptive: the node moves its own J (I + J fixed, starting at J) by comparing "
        "the reward gain after rounds with more and with fewer external groups; auto: adaptive for a node that "
        "trains on both local and external groups (I >= 1, J >= 1), else fixed. A round whose external side came "
        "back empty (no peer groups yet) trains on I alone and leaves J where it is",
    )
    balance_period: int = Field(default=10, ge=2, le=10_000, description="rounds between adaptive-balance decisions")
    inbox_max_groups: int = Field(default=512, ge=1, le=1_000_000, description="inbox cap on question groups")
    inbox_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, description="inbox cap on stored text, bytes")
    inbox_max_age_seconds: float = Field(default=600.0, gt=0, description="groups older than this are evicted")
    inbox_peer_share: float = Field(
        default=0.25, gt=0, le=1.0, description="most of the inbox one peer may hold; its oldest groups make way"
    )

    @model_validator(mode="after")
    def _can_train(self) -> SamplingSettings:
        if self.local == 0 and self.external == 0:
            raise ValueError("--local 0 with --external 0 trains on nothing: give --local (I) at least 1")
        if self.balance == "adaptive" and self.local == 0:
            raise ValueError("--balance adaptive keeps at least one local group a round: give --local at least 1")
        return self

    def balance_rule(self, trains: bool) -> Balance:
        """The balance these settings ask for, for a node that trains or not (--generate-only)."""
        adapts = self.balance == "adaptive" or (
            self.balance == "auto" and trains and self.local > 0 and self.external > 0
        )
        if adapts:
            return AdaptiveBalance(total=self.local + self.external, external=self.external, period=self.balance_period)
        return FixedBalance(self.local, self.external)
