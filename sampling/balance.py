"""How many local (I) and external (J) groups a node trains on in a round: its `RoundPlan`.

A fixed balance always plans the configured I/J. An adaptive balance moves a node's own I/J
(I + J fixed) by what it measures.

The rule, paired probes with a hill-climbing step:
- The node holds a centre J. Within each period of `period` rounds it alternates probes, J + step
  on even rounds and J - step on odd ones (clipped to [0, total - 1]), so both sides are tried under
  the same conditions and the slow upward trend of learning cancels out of the comparison.
- After each round it reports the *gain* of that round's training: its local reward in the next
  round minus its local reward in this one (a GRPO step on round t's set shows up in round t+1).
- At the end of a period it compares the mean gain of the "+" probes with the "-" probes. If
  more external groups gained more (by more than `margin`), the centre moves one step toward
  external; if fewer gained more, one step toward local; otherwise it stays.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RoundPlan:
    """What a round is asked to do, decided before it starts and handed to every step."""

    index: int  # the round number, from 1
    local: int  # I: local question groups to generate and train on
    external: int  # J: external groups to take from the inbox


@dataclass(frozen=True)
class FixedBalance:
    local: int
    external: int

    def plan(self, round_index: int) -> RoundPlan:
        return RoundPlan(round_index, self.local, self.external)

    def observe(self, round_index: int, gain: float) -> None:
        """A fixed balance learns nothing from a round."""

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: dict | None) -> None:
        """Nothing to restore: the settings say what the split is."""


@dataclass
class AdaptiveBalance:
    total: int = 8
    external: int = 4  # the centre J
    step: int = 1
    period: int = 10
    margin: float = 0.0
    history: list[tuple[int, int]] = field(default_factory=list)  # (round, centre J) after each move
    _gains: dict[int, list[float]] = field(default_factory=lambda: {+1: [], -1: []})

    def __post_init__(self) -> None:
        if self.total < 1 or not 0 <= self.external <= self.max_external:
            raise ValueError(f"adaptive balance needs 0 <= J ({self.external}) < I + J ({self.total}): "
                             "a node keeps at least one local group")
        if self.step < 1 or self.period < 2:
            raise ValueError("adaptive balance needs step >= 1 and period >= 2")

    @property
    def max_external(self) -> int:
        # At least one local group every round: it is what the node shares, and its reward is
        # what the balance measures (a round without local rollouts would read as reward 0).
        return self.total - 1

    def _side(self, round_index: int) -> int:
        return +1 if round_index % 2 == 0 else -1

    def plan(self, round_index: int) -> RoundPlan:
        """This round's probe: J one step above or below the centre."""
        j = min(self.max_external, max(0, self.external + self._side(round_index) * self.step))
        return RoundPlan(round_index, self.total - j, j)

    def observe(self, round_index: int, gain: float) -> None:
        """`gain`: next round's local reward minus this round's, for the split this round used."""
        self._gains[self._side(round_index)].append(gain)
        if round_index % self.period == 0:
            self._decide(round_index)

    def _decide(self, round_index: int) -> None:
        plus, minus = self._gains[+1], self._gains[-1]
        if plus and minus:
            diff = sum(plus) / len(plus) - sum(minus) / len(minus)
            if diff > self.margin:
                self.external = min(self.max_external, self.external + self.step)
            elif diff < -self.margin:
                self.external = max(0, self.external - self.step)
        self._gains = {+1: [], -1: []}
        self.history.append((round_index, self.external))

    def state_dict(self) -> dict:
        return {"external": self.external, "history": [list(h) for h in self.history],
                "gains": {"plus": list(self._gains[+1]), "minus": list(self._gains[-1])}}

    def load_state_dict(self, state: dict) -> None:
        self.external = int(state["external"])
        self.history = [(int(r), int(j)) for r, j in state["history"]]
        self._gains = {+1: [float(g) for g in state["gains"]["plus"]], -1: [float(g) for g in state["gains"]["minus"]]}
