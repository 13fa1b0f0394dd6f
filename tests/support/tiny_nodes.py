"""The daemon's own `Node` on the smallest model, for tests of what rounds change: built in the
test's process, traded over the in-memory hub."""

from sapo.node.core.node import Node
from sapo.node.core.settings import load_settings

PEER = "12D3KooWpeerpeerpeerpeerpeerpeerpeerpeerpeerpeer"


def half_right(problem, completions):
    """A verifier that gives every group a signal (an untrained tiny model earns nothing)."""
    return [float(i % 2 == 0) for i in range(len(completions))]


def tiny_node(data_dir, peer_id="12D3KooWtest", **settings) -> Node:
    """A tiny-micro node that trades 3 local and 3 external groups a round and never checkpoints
    on its own; `settings` overrides any of it."""
    return Node(
        load_settings(
            {
                "model": "tiny-micro",
                "tasks": ["basic_arithmetic"],
                "warm_start_steps": 0,
                "generations": 2,
                "max_new_tokens": 4,
                "local": 3,
                "external": 3,
                "data_dir": data_dir,
                "torch_threads": 1,
                "checkpoint_every": 0,
                "inbox_max_age_seconds": 10**9,
                **settings,
            }
        ),
        peer_id=peer_id,
        verifier=half_right,
    )


def member(hub, node, receives=True):
    """`node` joined to the in-memory `hub`; with `receives` False it only publishes."""
    return hub.join(node.peer_id, node.settings, memory=node.memory if receives else None, counters=node.counters)
