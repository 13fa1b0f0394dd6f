"""The page's curves and what else it shows of past rounds, bounded however long a node runs.

A node that runs for months must not hold every round it ran (a round record is about 5.6 KB in
memory): `Curve` keeps at most MAX_POINTS bins of consecutive rounds, as sums and counts, and
`RoundHistory` adds the last round and the latest held-out accuracy. The live page and
`sapo-node status DATA_DIR` both build theirs with `RoundHistory`, so they draw the same bins.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field

from sapo.node.core.metrics import RoundRecord

# The page draws at most this many points per curve; longer runs are averaged in bins.
MAX_POINTS = 1000


class CurvePoint(BaseModel):
    """One round (or the mean of a bin of rounds) on the page's curves."""

    round: int = Field(description="the round (the last one of a bin)")
    time: float
    reward: float = Field(description="mean reward of the local completions")
    accuracy: float = Field(description="fraction of local completions with full credit")
    format_rate: float = Field(description="fraction of local completions with an <answer> tag")
    external_reward: float | None = Field(description="this node's verifier on the external completions it trained on")
    heldout: float | None = Field(description="held-out greedy accuracy, mean over tasks (--eval-every rounds only)")
    external_groups: float
    generate_seconds: float
    train_seconds: float
    round_seconds: float


def curve_point(record: RoundRecord) -> CurvePoint:
    heldout = record.heldout
    return CurvePoint(
        round=record.round,
        time=record.time,
        reward=record.reward_mean,
        accuracy=record.accuracy,
        format_rate=record.format_rate,
        external_reward=record.external_reward_mean,
        heldout=sum(heldout.values()) / len(heldout) if heldout else None,
        external_groups=record.external_groups,
        generate_seconds=record.generate_seconds,
        train_seconds=record.train_seconds,
        round_seconds=record.round_seconds,
    )


# The curve fields that are averaged over a bin of rounds (round and time are its last round's).
AVERAGED = tuple(name for name in CurvePoint.model_fields if name not in ("round", "time"))


class Curve:
    """At most `limit` points, kept as rounds come: consecutive rounds averaged in bins of equal
    size (the last one filling), newest last. When a round would make `limit + 1` bins,
    neighbouring bins merge and the size doubles."""

    def __init__(self, limit: int = MAX_POINTS):
        self.limit = limit
        self.size = 1  # rounds per bin
        self._bins: list[_Bin] = []

    def add(self, point: CurvePoint) -> None:
        if not self._bins or self._bins[-1].rounds >= self.size:
            if len(self._bins) >= self.limit:
                self._bins = [_Bin.merge(self._bins[i : i + 2]) for i in range(0, len(self._bins), 2)]
                self.size *= 2
            if not self._bins or self._bins[-1].rounds >= self.size:
                self._bins.append(_Bin())
        self._bins[-1].add(point)

    def points(self) -> list[CurvePoint]:
        return [b.mean() for b in self._bins]


class _Bin:
    """Sums and counts of a run of consecutive rounds."""

    def __init__(self) -> None:
        self.rounds = 0
        self.last: tuple[int, float] = (0, 0.0)  # the round and time of its newest point
        self.sums = dict.fromkeys(AVERAGED, 0.0)
        self.counts = dict.fromkeys(AVERAGED, 0)  # held-out accuracy is measured on some rounds only

    def add(self, point: CurvePoint) -> None:
        self.rounds += 1
        self.last = (point.round, point.time)
        for name in AVERAGED:
            value = getattr(point, name)
            if value is not None:
                self.sums[name] += value
                self.counts[name] += 1

    @staticmethod
    def merge(bins: list[_Bin]) -> _Bin:
        merged = _Bin()
        for b in bins:
            merged.rounds += b.rounds
            merged.last = b.last
            for name in AVERAGED:
                merged.sums[name] += b.sums[name]
                merged.counts[name] += b.counts[name]
        return merged

    def mean(self) -> CurvePoint:
        means = {name: self.sums[name] / self.counts[name] if self.counts[name] else None for name in AVERAGED}
        return CurvePoint(round=self.last[0], time=self.last[1], **means)


class RoundHistory:
    """What the page shows of past rounds: the curves, the last round's reward per task and the
    latest held-out accuracy."""

    def __init__(self, records: Iterable[RoundRecord] = ()):
        self.curve = Curve()
        self.last: RoundRecord | None = None
        self.last_judged: RoundRecord | None = None
        for record in records:
            self.add(record)

    def add(self, record: RoundRecord) -> None:
        self.curve.add(curve_point(record))
        self.last = record
        if record.heldout:
            self.last_judged = record

    def fields(self) -> dict:
        """NodeStatus fields: none before the first round."""
        found: dict = {}
        if self.last is not None:
            found |= {"rounds": self.curve.points(), "per_task": self.last.per_task}
        if self.last_judged is not None:
            found |= {"heldout": self.last_judged.heldout, "heldout_round": self.last_judged.round}
        return found
