"""A node stopped after round k and built again from its checkpoint plays round k + 1 as the
node that never stopped does: the same questions, the same external choice, and its random
streams and task cursor left where that node's are. Only its completions differ: a resumed node
mixes a per-start nonce into its generation seed, so its peers never see a completion twice
(test_resume_seed.py)."""

import shutil
import time

import trio

from sapo.node.core.memory_exchange import MemoryHub
from sapo.node.core.round import run_round
from sapo.training.problems.tasks import reasoning_gym_version
from tests.support.tiny_nodes import PEER, member, tiny_node

# The inbox holds one round of the peer's groups: the peer's newest 6 groups are both nodes' whole
# inbox when round k + 1 chooses 3 of them (the checkpoint keeps the inbox too, node/core/memory.py).
SETTINGS = {"inbox_max_groups": 6, "inbox_peer_share": 1.0, "standing": "off", "screen": "off"}


async def test_a_node_resumed_from_its_checkpoint_asks_and_chooses_as_if_it_had_never_stopped(tmp_path):
    node, peer = tiny_node(tmp_path / "a", **SETTINGS), tiny_node(tmp_path / "peer", PEER, local=6, external=0)
    hub = MemoryHub(time.time, rg_version=reasoning_gym_version())
    mine, theirs = member(hub, node), member(hub, peer, receives=False)
    state, peer_state = node.start_state(), peer.start_state()
    for _ in range(2):
        peer_state = (await run_round(peer, peer_state, theirs, trio.Lock())).state
        state = (await run_round(node, state, mine, trio.Lock())).state
    node.checkpoint(state)  # the node stops here...
    shutil.copytree(tmp_path / "a" / "checkpoints", tmp_path / "b" / "checkpoints")
    restored = tiny_node(tmp_path / "b", **SETTINGS)  # ...and starts again from its checkpoint
    resumed = restored.start_state()
    assert resumed == state and resumed.round == 2

    again = member(hub, restored)
    await run_round(peer, peer_state, theirs, trio.Lock())  # round 3's groups reach both inboxes
    candidates = node.inbox.newest_first(time.time())
    assert restored.inbox.newest_first(time.time()) == candidates and len(candidates) == 6
    never_stopped = await run_round(node, state, mine, trio.Lock())
    after_resume = await run_round(restored, resumed, again, trio.Lock())

    assert after_resume.plan == never_stopped.plan and never_stopped.plan.index == 3
    questions = [g.problem for g in never_stopped.generation.groups]
    assert len(questions) == never_stopped.plan.local
    assert [g.problem for g in after_resume.generation.groups] == questions
    chosen = never_stopped.training_set.external
    assert after_resume.training_set.external == chosen and 0 < len(chosen) < len(candidates)
    # the task cursor, and the streams of the external choice and of the update
    assert after_resume.state.streams == never_stopped.state.streams
    assert after_resume.state.sampler == never_stopped.state.sampler
    # the nonce stays: the same round, sampled with another seed
    assert restored.generation_seed(after_resume.plan) != node.generation_seed(never_stopped.plan)


def test_a_checkpoint_of_sapo_0_3_resumes_its_random_streams_from_trainer_pt():
    """sapo 0.3 kept the random streams and the task cursor in trainer.pt, beside the optimizer."""
    import random

    from sapo.node.core.state import NodeState, RandomStreams, TaskCursor, restore_state
    from sapo.sampling.balance import BalanceState

    first = NodeState(balance=BalanceState(external=4), streams=RandomStreams.from_seed(0))
    saved = first.model_copy(update={"round": 7}).to_json()
    del saved["streams"]
    draws = [random.Random(seed) for seed in (10, 11, 12)]
    for stream in draws:
        stream.random()
    tasks, mix, update = (stream.getstate() for stream in draws)
    trainer = {"optimizer": None, "mix_rng": mix, "update_rng": update, "tasks": {"next_index": 21, "rng": tasks}}
    state = restore_state(saved, trainer, first)
    assert state.round == 7 and state.streams == RandomStreams(
        tasks=TaskCursor(next_index=21, rng=tasks), mix=mix, update=update
    )
