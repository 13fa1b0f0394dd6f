"""What a node's rounds change, as one value: it goes into each round, comes out of it, and is
kept in every checkpoint, so a node stopped anywhere resumes with the same next round."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from sapo.sampling.balance import BalanceState
from sapo.sampling.screen import ScreenReference
from sapo.sampling.strategies import SamplerState


class NodeState(BaseModel):
    model_config = ConfigDict(frozen=True)

    round: int = 0  # the last round done
    cumulative_reward: float = 0.0  # sum over rounds of the mean local reward (the paper's metric)
    balance: BalanceState  # what the local/external balance has learnt
    sampler: SamplerState = SamplerState()  # what the external sampler has learnt (peer-weighted)
    screen: ScreenReference = ScreenReference()  # this node's own recent completions, as the screen measures them

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def restore_state(saved: dict[str, Any], trainer: dict[str, Any], initial_balance: BalanceState) -> NodeState:
    """The state a checkpoint holds. Checkpoints written before the state was one value (sapo
    0.2 and earlier) kept the balance in trainer.pt and no sampler state: the balance's centre
    and decisions carry over, the probe in flight does not (the next round plans the centre),
    and the sampler starts afresh."""
    if "balance" in saved:
        return NodeState.model_validate(saved, strict=False)
    legacy = trainer.get("balance")
    balance = initial_balance
    if legacy:
        balance = BalanceState(
            external=int(legacy["external"]),
            history=tuple((int(r), int(j)) for r, j in legacy["history"]),
            plus=tuple(float(g) for g in legacy["gains"]["plus"]),
            minus=tuple(float(g) for g in legacy["gains"]["minus"]),
        )
    return NodeState(round=int(saved["round"]), cumulative_reward=float(saved["cumulative_reward"]), balance=balance)
