"""How many local (I) and external (J) groups a node trains on in a round: its `RoundPlan`.

A fixed balance always plans the configured I/J. An adaptive balance moves a node's own I/J
(I + J fixed) by what it measures. Both are rules without state: what a balance has learnt is
a `BalanceState` value that goes into each round and comes out of it, and into checkpoints.

The adaptive rule, paired probes with a hill-climbing step:
- The node holds a centre J. It alternates probes, J + step on even rounds and J - step on odd
  ones (clipped to [0, total - 1]), so both sides are tried under the same conditions and the
  slow upward trend of learning cancels out of the comparison.
- After each round it reports the round's local reward; the *gain* of a round's training is the
  next round's reward minus its own (a GRPO step on round t's set shows up in round t+1).
- Every `period` rounds it compares the mean gain of the "+" probes with the "-" probes. If
  more external groups gained more (by more than `margin`), the centre moves one step toward
  external; if fewer gained more, one step toward local; otherwise it stays.
- The balance knows what it got: a round that planned external groups and got none (the inbox
  had nothing to give: a lonely node, or peers not yet heard from) measured nothing about J.
  Its gain is not counted, and the next round plans the centre instead of a probe. So a node
  alone trains on the same I every round and its J stays where it was; probing starts once
  peers' groups arrive. (The other choice, topping the round up with local groups, would make a
  lonely node generate more than its plan.) At a centre of J = 0 the "+" probe still asks for
  one group every other round: it is how such a node notices that peers have come.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict

# Decisions kept in the state (for the page and the logs); older ones are dropped.
HISTORY_LIMIT = 100


@dataclass(frozen=True)
class RoundPlan:
    """What a round is asked to do, decided before it starts and handed to every step."""

    index: int  # the round number, from 1
    local: int  # I: local question groups to generate and train on
    external: int  # J: external groups to take from the inbox


class Outcome(BaseModel):
    """What the balance keeps of the last round: the split it probed and what came of it."""

    model_config = ConfigDict(frozen=True)

    round: int
    side: int  # +1 or -1: a probe above or below the centre; 0: the centre itself
    planned: int  # external groups the round planned
    external: int  # external groups it actually trained on
    reward: float  # its mean local reward

    @property
    def measured(self) -> bool:
        """Whether the round tried the split it planned: not when it planned external groups and
        the inbox had none to give."""
        return not (self.planned > 0 and self.external == 0)


class BalanceState(BaseModel):
    model_config = ConfigDict(frozen=True)

    external: int  # the centre J
    last: Outcome | None = None
    plus: tuple[float, ...] = ()  # gains of the "+" probes this period
    minus: tuple[float, ...] = ()
    history: tuple[tuple[int, int], ...] = ()  # (round, centre J) after each decision, the last HISTORY_LIMIT


class Balance(Protocol):
    def initial(self) -> BalanceState: ...

    def plan(self, state: BalanceState, round_index: int) -> RoundPlan: ...

    def observe(self, state: BalanceState, plan: RoundPlan, external: int, reward: float) -> BalanceState: ...

    @property
    def most_external(self) -> int:
        """The most external groups any round may plan: what a node asks its peers for."""
        ...


@dataclass(frozen=True)
class FixedBalance:
    local: int
    external: int

    @property
    def most_external(self) -> int:
        return self.external

    def initial(self) -> BalanceState:
        return BalanceState(external=self.external)

    def plan(self, state: BalanceState, round_index: int) -> RoundPlan:
        return RoundPlan(round_index, self.local, self.external)

    def observe(self, state: BalanceState, plan: RoundPlan, external: int, reward: float) -> BalanceState:
        """A fixed balance learns nothing from a round."""
        return state


@dataclass(frozen=True)
class AdaptiveBalance:
    total: int = 8
    external: int = 4  # where the centre J starts
    step: int = 1
    period: int = 10
    margin: float = 0.0

    def __post_init__(self) -> None:
        if self.total < 1 or not 0 <= self.external <= self.max_external:
            raise ValueError(
                f"adaptive balance needs 0 <= J ({self.external}) < I + J ({self.total}): "
                "a node keeps at least one local group"
            )
        if self.step < 1 or self.period < 2:
            raise ValueError("adaptive balance needs step >= 1 and period >= 2")

    @property
    def max_external(self) -> int:
        # At least one local group every round: it is what the node shares, and its reward is
        # what the balance measures (a round without local rollouts would read as reward 0).
        return self.total - 1

    @property
    def most_external(self) -> int:
        return self.max_external

    def initial(self) -> BalanceState:
        return BalanceState(external=self.external)

    def side(self, state: BalanceState, round_index: int) -> int:
        """This round's probe: +1 or -1 by the round's parity, or 0 (the centre) after a round
        whose external side came back empty, and before the first."""
        if state.last is None or not state.last.measured:
            return 0
        return +1 if round_index % 2 == 0 else -1

    def plan(self, state: BalanceState, round_index: int) -> RoundPlan:
        j = min(self.max_external, max(0, state.external + self.side(state, round_index) * self.step))
        return RoundPlan(round_index, self.total - j, j)

    def observe(self, state: BalanceState, plan: RoundPlan, external: int, reward: float) -> BalanceState:
        """Round `plan.index` trained on `external` groups and scored `reward`: the gain of the
        round before it is now known. Every `period` rounds, a decision."""
        last, plus, minus = state.last, state.plus, state.minus
        if last is not None and last.side != 0 and last.measured:
            gain = reward - last.reward
            plus, minus = (plus + (gain,), minus) if last.side > 0 else (plus, minus + (gain,))
        state = state.model_copy(
            update={
                "plus": plus,
                "minus": minus,
                "last": Outcome(
                    round=plan.index,
                    side=self.side(state, plan.index),
                    planned=plan.external,
                    external=external,
                    reward=reward,
                ),
            }
        )
        if last is not None and last.round % self.period == 0:
            state = self._decide(state, last.round)
        return state

    def _decide(self, state: BalanceState, round_index: int) -> BalanceState:
        centre, plus, minus = state.external, state.plus, state.minus
        if plus and minus:
            diff = sum(plus) / len(plus) - sum(minus) / len(minus)
            if diff > self.margin:
                centre = min(self.max_external, centre + self.step)
            elif diff < -self.margin:
                centre = max(0, centre - self.step)
        history = (*state.history, (round_index, centre))[-HISTORY_LIMIT:]
        return state.model_copy(update={"external": centre, "plus": (), "minus": (), "history": history})
