"""A daemon node with `--balance adaptive` moves its own I/J, and its checkpoint keeps the balance."""

import time

import trio

from sapo.node.daemon.counters import NodeCounters
from sapo.node.daemon.memory_exchange import MemoryHub
from sapo.node.daemon.node import Node
from sapo.node.daemon.round import run_round
from sapo.node.daemon.settings import load_settings


def adaptive_node(tmp_path):
    settings = load_settings({
        "model": "tiny-micro", "tasks": ["basic_arithmetic"], "warm_start_steps": 0, "generations": 2,
        "max_new_tokens": 4, "local": 3, "external": 3, "balance": "adaptive", "balance_period": 2,
        "data_dir": tmp_path, "torch_threads": 1, "checkpoint_every": 0,
    })
    return Node(settings, peer_id="12D3KooWtest")


async def test_adaptive_node_probes_both_sides_and_restores_its_centre(tmp_path):
    node = adaptive_node(tmp_path)
    alone = MemoryHub(time.time, swarm="t", rg_version="x").join(
        node.peer_id, model_id="tiny-micro", inbox=node.inbox, counters=NodeCounters(), max_message_bytes=2**18,
        max_age_seconds=600,
    )
    seen = []
    for round_index in (1, 2, 3, 4):
        result = await run_round(node, alone, node.plan(round_index), trio.Lock())
        seen.append((len(result.generation.groups), (result.plan.local, result.plan.external)))
    # odd rounds probe J - 1, even rounds J + 1, around the centre J = 3 (I + J = 6)
    assert seen[:3] == [(4, (4, 2)), (2, (2, 4)), (4, (4, 2))]
    assert all(groups == split[0] and sum(split) == 6 for groups, split in seen)
    assert node.balance.history and node.balance.history[0][0] == 2  # a decision every balance_period rounds
    assert node.round == 4 and len(node.metrics.read()) == 4
    node.checkpoint()
    restored = adaptive_node(tmp_path)
    assert restored.round == 4
    assert restored.balance.state_dict() == node.balance.state_dict()
    assert restored.last_reward == node.last_reward
