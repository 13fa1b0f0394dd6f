"""What rounds change is a value that goes in and out of `run_round` and into checkpoints: a node
alone keeps its split, a node with peers probes both sides, and a node stopped mid-run resumes
with the same state, the same sampler memory and the same next round."""

import time

import trio

from sapo.node.core.memory_exchange import MemoryHub
from sapo.node.core.round import run_round
from sapo.sampling.balance import AdaptiveBalance
from sapo.training.problems.tasks import reasoning_gym_version
from tests.support.tiny_nodes import PEER, member, tiny_node


async def test_a_node_alone_keeps_its_split_and_its_j_under_the_default_balance(tmp_path):
    node = tiny_node(tmp_path)  # the default balance: adaptive, as I >= 1 and J >= 1
    assert isinstance(node.balance, AdaptiveBalance)
    alone = member(MemoryHub(time.time, rg_version=reasoning_gym_version()), node)
    state = node.start_state()
    splits = set()
    for _ in range(30):
        result = await run_round(node, state, alone, trio.Lock())
        state = result.state
        splits.add(
            (len(result.training_set.local), result.plan.local, result.plan.external, result.record.external_groups)
        )
    assert splits == {(3, 3, 3, 0)}  # 3 local groups every round; J planned 3, and nothing came
    assert state.round == 30 and state.balance.external == 3 and {j for _, j in state.balance.history} == {3}


async def test_with_a_peer_the_adaptive_node_probes_both_sides_of_its_centre(tmp_path):
    node, peer = tiny_node(tmp_path / "a", balance="adaptive"), tiny_node(tmp_path / "b", PEER, local=6, external=0)
    hub = MemoryHub(time.time, rg_version=reasoning_gym_version())
    mine, theirs = member(hub, node), member(hub, peer, receives=False)
    state, peer_state = node.start_state(), peer.start_state()
    plans = []
    for _ in range(4):
        peer_state = (await run_round(peer, peer_state, theirs, trio.Lock())).state  # its groups reach our inbox
        result = await run_round(node, state, mine, trio.Lock())
        state = result.state
        plans.append((result.plan.local, result.plan.external))
        assert result.record.external_groups > 0
    assert plans == [(3, 3), (2, 4), (4, 2), (2, 4)]  # the centre, then J + 1 on even rounds and J - 1 on odd ones
    assert state.balance.plus and state.balance.minus


async def test_a_stopped_node_resumes_with_its_sampler_memory_and_the_same_next_round(tmp_path):
    def weighted(data_dir):
        return tiny_node(data_dir, sampler="peer-weighted", balance="fixed")

    node, peer = weighted(tmp_path / "a"), tiny_node(tmp_path / "b", PEER, local=6, external=0)
    hub = MemoryHub(time.time, rg_version=reasoning_gym_version())
    mine, theirs = member(hub, node), member(hub, peer, receives=False)
    state, peer_state = node.start_state(), peer.start_state()
    for _ in range(3):
        peer_state = (await run_round(peer, peer_state, theirs, trio.Lock())).state
        state = (await run_round(node, state, mine, trio.Lock())).state
    assert state.sampler.usefulness and len(state.sampler.seen) == 18  # it has learnt something about its peer
    node.checkpoint(state)  # what the daemon does on a stop signal

    restored = weighted(tmp_path / "a")
    resumed = restored.start_state()
    assert resumed == state and resumed.round == 3
    # the same next round: same plan, and from the same inbox (restored with its memory, then the
    # peer's next groups reach both), the same choice and sampler memory
    member(hub, restored)
    peer_state = (await run_round(peer, peer_state, theirs, trio.Lock())).state
    assert restored.inbox.newest_first(time.time()) == node.inbox.newest_first(time.time())
    plan = node.plan(state)
    assert restored.plan(resumed) == plan and plan.index == 4
    now = time.time()
    choice = node.mix(plan, state, now)
    assert len(choice.external) == 3 and restored.mix(plan, resumed, now) == choice
    assert restored.questions(plan, resumed.streams.tasks) == node.questions(plan, state.streams.tasks)
    assert len(node.metrics.path.read_text().splitlines()) == 3


def test_a_checkpoint_of_sapo_0_2_resumes_its_round_totals_and_balance():
    from sapo.node.core.state import NodeState, RandomStreams, restore_state
    from sapo.sampling.balance import BalanceState

    def first(balance):
        return NodeState(balance=balance, streams=RandomStreams.from_seed(0))

    # what sapo 0.2 wrote: the totals in state.json, the balance and last reward in trainer.pt
    saved = {"round": 40, "cumulative_reward": 12.5, "peer_id": "12D3KooWtest", "settings": {}}
    trainer = {
        "balance": {"external": 6, "history": [[10, 5], [20, 6]], "gains": {"plus": [0.1], "minus": []}},
        "last_reward": 0.4,
    }
    state = restore_state(saved, trainer, first(BalanceState(external=4)))
    assert (state.round, state.cumulative_reward, state.balance.external) == (40, 12.5, 6)
    assert state.balance.history == ((10, 5), (20, 6)) and state.balance.plus == (0.1,)
    assert state.balance.last is None  # the probe in flight is dropped: the next round plans the centre
    fixed = restore_state(saved, {"balance": None}, first(BalanceState(external=4)))  # a fixed balance kept nothing
    assert fixed.balance == BalanceState(external=4) and fixed.round == 40
    # and what this release writes comes back whole
    assert restore_state(state.to_json() | {"peer_id": "x"}, {}, first(BalanceState(external=0))) == state
