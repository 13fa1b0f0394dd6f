"""Gossip and the in-process hub are the same `Exchange` to a round: same methods, same signatures."""

import inspect

from sapo.node.core.exchange import GossipExchange
from sapo.node.core.memory_exchange import MemoryExchange
from sapo.node.core.round import Exchange


def test_both_exchanges_have_the_protocols_signatures():
    for name in ("publish", "peers"):
        wanted = inspect.signature(getattr(Exchange, name))
        for implementation in (GossipExchange, MemoryExchange):
            method = getattr(implementation, name)
            assert inspect.signature(method) == wanted, (implementation.__name__, name)
            assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(getattr(Exchange, name))


async def test_shared_log_probs_cross_the_wire_and_reach_the_receivers_inbox():
    from sapo.node.core.counters import NodeCounters
    from sapo.node.core.memory_exchange import MemoryHub
    from sapo.node.core.settings import NodeSettings
    from sapo.node.study.nodes import peer_id_for
    from sapo.sampling.inbox import Inbox
    from sapo.training.problems.rollouts import Behavior
    from sapo.training.problems.tasks import reasoning_gym_version
    from tests.support.groups import honest_group
    from tests.support.receiving import memory_for

    hub = MemoryHub(lambda: 1_700_000_000.0, rg_version=reasoning_gym_version())
    inbox = Inbox(16, 2**20, 600)
    shares, keeps = (NodeSettings().updated({"share_logprobs": share}) for share in (True, False))
    sender = hub.join(peer_id_for(0, 0), shares, memory=None, counters=NodeCounters())
    quiet = hub.join(peer_id_for(0, 1), keeps, memory=None, counters=NodeCounters())
    hub.join(peer_id_for(0, 2), keeps, memory=memory_for(keeps, peer_id_for(0, 2), inbox), counters=NodeCounters())
    behavior = Behavior(tokenizer="abc", temperature=1.0, token_logprobs=[[-0.5, -0.25], [-1.0]])
    group = honest_group().model_copy(update={"behavior": behavior})
    await sender.publish([group], 1)
    await quiet.publish([group], 1)
    received = {g.origin: g for g in inbox.newest_first(1_700_000_000.0)}
    assert received[peer_id_for(0, 0)].behavior == behavior
    assert received[peer_id_for(0, 1)].behavior is None  # not shared unless the sender says so
