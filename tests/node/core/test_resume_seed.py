"""A node resumed from a checkpoint never publishes again what it published before it stopped:
its rounds after the checkpoint sample new completions, so its peers charge it no `repeat`. A
node that never resumes (every study run) keeps its fixed seeds."""

import time

import trio

from sapo.node.core.memory_exchange import MemoryHub
from sapo.node.core.round import run_round
from sapo.training.problems.tasks import reasoning_gym_version
from tests.support.tiny_nodes import PEER, member, tiny_node


async def test_a_resumed_node_redoes_its_rounds_with_new_completions_and_is_charged_nothing(tmp_path):
    sender = tiny_node(tmp_path / "a", local=3, external=0, max_new_tokens=24)
    receiver = tiny_node(tmp_path / "b", PEER, local=1, external=3)
    hub = MemoryHub(time.time, rg_version=reasoning_gym_version())
    theirs, mine = member(hub, sender), member(hub, receiver)
    state = sender.start_state()
    plan = sender.plan(state)
    assert sender.generation_seed(plan) == sender.settings.seed * 1_000_003 + plan.index  # never resumed: fixed
    state = (await run_round(sender, state, theirs, trio.Lock())).state
    sender.checkpoint(state)
    await run_round(sender, state, theirs, trio.Lock())  # published, then the node stops before its next checkpoint

    restored = tiny_node(tmp_path / "a", local=3, external=0, max_new_tokens=24)
    resumed = restored.start_state()
    assert resumed == state and restored.plan(resumed) == sender.plan(state)  # the same round again...
    assert restored.generation_seed(restored.plan(resumed)) != sender.generation_seed(sender.plan(state))
    await run_round(restored, resumed, member(hub, restored), trio.Lock())  # ...sampled anew
    assert receiver.counters.rejected.get("repeat", 0) == 0
    assert receiver.counters.accepted_from[sender.peer_id] == 9
    del mine
