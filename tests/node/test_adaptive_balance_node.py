"""A daemon node with `--balance adaptive` moves its own I/J, and its checkpoint keeps the balance."""

from sapo.node.core import Node
from sapo.node.settings import load_settings


def adaptive_node(tmp_path):
    settings = load_settings({
        "model": "tiny-micro", "tasks": ["basic_arithmetic"], "warm_start_steps": 0, "generations": 2,
        "max_new_tokens": 4, "local": 3, "external": 3, "balance": "adaptive", "balance_period": 2,
        "data_dir": tmp_path, "torch_threads": 1,
    })
    return Node(settings, peer_id="12D3KooWtest")


def test_adaptive_node_probes_both_sides_and_restores_its_centre(tmp_path):
    node = adaptive_node(tmp_path)
    seen = []
    for round_index in (1, 2, 3, 4):
        generation = node.generate(round_index)
        seen.append((len(generation.groups), node.split))
        training_set = node.mix(generation)
        node.record(round_index, generation, training_set, None, 0.0, [])
    # odd rounds probe J - 1, even rounds J + 1, around the centre J = 3 (I + J = 6)
    assert seen[:3] == [(4, (4, 2)), (2, (2, 4)), (4, (4, 2))]
    assert all(groups == split[0] and sum(split) == 6 for groups, split in seen)
    assert node.balance.history and node.balance.history[0][0] == 2  # a decision every balance_period rounds
    node.checkpoint()
    restored = adaptive_node(tmp_path)
    assert restored.round == 4
    assert restored.balance.state_dict() == node.balance.state_dict()
    assert restored.last_reward == node.last_reward
