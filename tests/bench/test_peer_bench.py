"""The peer adapters' version handling, without the peer venvs (bench/peers/ is not made by the tests)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.peer_bench.common import one_update_step
from bench.round_peers import PEERS

BENCH = Path(__file__).resolve().parents[2] / "bench"

JOB = {"batches": [{"prompts": ["a", "b", "c", "d"]}], "generations": 8}


@dataclasses.dataclass
class Config0111:  # the fields of gensyn-genrl 0.1.11's GRPOTrainerConfig that matter here
    learning_rate: float = 1e-5
    num_iterations: int = 1


@dataclasses.dataclass
class Config030:  # ... and of 0.3.0's: num_iterations became ppo_epochs and minibatch_size
    learning_rate: float = 1e-6
    ppo_epochs: int = 1
    minibatch_size: int = 2


def test_one_update_step_in_either_genrl():
    assert one_update_step(dataclasses.fields(Config0111), JOB) == {"num_iterations": 1}
    # one epoch of one minibatch holding all Q x G sequences: one Adam step, as 0.1.11 takes
    assert one_update_step(dataclasses.fields(Config030), JOB) == {"ppo_epochs": 1, "minibatch_size": 32}


def test_one_update_step_refuses_an_unknown_genrl():
    @dataclasses.dataclass
    class Unknown:
        learning_rate: float = 1e-6

    with pytest.raises(SystemExit, match="neither num_iterations"):
        one_update_step(dataclasses.fields(Unknown), JOB)


def test_every_peer_has_an_adapter():
    assert {"genrl", "genrl-0.3", "trl"} <= set(PEERS)
    for peer, adapter in PEERS.items():
        assert (BENCH / "peer_bench" / adapter).is_file(), (peer, adapter)
