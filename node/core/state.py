"""What a node's rounds change, as one value: it goes into each round, comes out of it, and is
kept in every checkpoint, so a node stopped anywhere resumes with the same next round."""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, ConfigDict

from sapo.sampling.balance import BalanceState
from sapo.sampling.screen import ScreenReference
from sapo.sampling.strategies import SamplerState

# A `random.Random`'s state as a value: what `getstate()` returns and `setstate()` takes.
RngState = tuple[int, tuple[int, ...], float | None]


def seeded(seed: int) -> RngState:
    return random.Random(seed).getstate()


def stream_at(state: RngState) -> random.Random:
    """A random stream that draws on from `state`; its `getstate()` afterwards is where it got to."""
    stream = random.Random()
    stream.setstate(state)
    return stream


class TaskCursor(BaseModel):
    """Where a node's task stream goes on (training/problems/tasks.py:TaskSampler's state)."""

    model_config = ConfigDict(frozen=True)

    next_index: int  # the next question's index in the node's own dataset
    rng: RngState  # which task each question is drawn from


class RandomStreams(BaseModel):
    """Where a node's random draws go on: the task stream, the external choice and the update's
    minibatch order. Seeded from --seed at round 0; each round hands on where it left them."""

    model_config = ConfigDict(frozen=True)

    tasks: TaskCursor
    mix: RngState
    update: RngState

    @classmethod
    def from_seed(cls, seed: int) -> RandomStreams:
        return cls(tasks=TaskCursor(next_index=0, rng=seeded(seed)), mix=seeded(seed + 1), update=seeded(seed + 2))


class NodeState(BaseModel):
    model_config = ConfigDict(frozen=True)

    round: int = 0  # the last round done
    cumulative_reward: float = 0.0  # sum over rounds of the mean local reward (the paper's metric)
    balance: BalanceState  # what the local/external balance has learnt
    streams: RandomStreams  # where the node's random draws go on
    sampler: SamplerState = SamplerState()  # what the external sampler has learnt (peer-weighted)
    screen: ScreenReference = ScreenReference()  # this node's own recent completions, as the screen measures them

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def restore_state(saved: dict[str, Any], trainer: dict[str, Any], initial: NodeState) -> NodeState:
    """The state a checkpoint holds, what it lacks taken from `initial` (the node's round 0).
    Checkpoints written before the random streams were in the state (sapo 0.3 and earlier) kept
    them in trainer.pt. Those written before the state was one value (sapo 0.2 and earlier) also
    kept the balance there and no sampler state: the balance's centre and decisions carry over,
    the probe in flight does not (the next round plans the centre), and the sampler starts afresh."""
    streams = initial.streams
    if "mix_rng" in trainer:
        tasks = trainer["tasks"]
        streams = RandomStreams(
            tasks=TaskCursor(next_index=tasks["next_index"], rng=tasks["rng"]),
            mix=trainer["mix_rng"],
            update=trainer["update_rng"],
        )
    if "balance" in saved:
        return NodeState.model_validate({"streams": streams.model_dump()} | saved, strict=False)
    legacy = trainer.get("balance")
    balance = initial.balance
    if legacy:
        balance = BalanceState(
            external=int(legacy["external"]),
            history=tuple((int(r), int(j)) for r, j in legacy["history"]),
            plus=tuple(float(g) for g in legacy["gains"]["plus"]),
            minus=tuple(float(g) for g in legacy["gains"]["minus"]),
        )
    return NodeState(
        round=int(saved["round"]), cumulative_reward=float(saved["cumulative_reward"]), balance=balance, streams=streams
    )
