"""Gossip and the in-process hub are the same `Exchange` to a round: same methods, same signatures."""

import inspect

from sapo.node.daemon.exchange import GossipExchange
from sapo.node.daemon.memory_exchange import MemoryExchange
from sapo.node.daemon.round import Exchange


def test_both_exchanges_have_the_protocols_signatures():
    for name in ("publish", "peers"):
        wanted = inspect.signature(getattr(Exchange, name))
        for implementation in (GossipExchange, MemoryExchange):
            method = getattr(implementation, name)
            assert inspect.signature(method) == wanted, (implementation.__name__, name)
            assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(getattr(Exchange, name))
