"""Keys behind one network address group share one standing: over real libp2p on loopback, the
exchange locates an accepted group's author by its direct connection ("local" for every
unroutable address, as reachability counts them), and the standing weighs it with its neighbours."""

from __future__ import annotations

import time

import trio

from sapo.node.core.counters import NodeCounters
from sapo.node.core.exchange import GossipExchange, GroupEncoder
from sapo.node.core.intake import node_intake
from sapo.node.core.memory import NodeMemory
from sapo.node.core.node import node_inbox
from sapo.node.core.settings import load_settings
from sapo.training.problems.rewards import score_group
from sapo.training.problems.tasks import reasoning_gym_version
from tests.support.gossip import SWARM, receive_all, start_node, wait_for_mesh
from tests.support.groups import honest_group


async def test_an_accepted_authors_network_group_is_recorded_and_shared():
    settings = load_settings({"model": "tiny", "tasks": ["basic_arithmetic"], "swarm": SWARM})
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery)
            b = await start_node(nursery, peers=[a.addr])
            await wait_for_mesh([a, b])
            inbox, counters = node_inbox(settings), NodeCounters()
            intake = node_intake(
                settings, counters, peer_id=b.service.peer_id, rg_version=reasoning_gym_version(), verifier=score_group
            )
            exchange = GossipExchange(
                b.service,
                GroupEncoder(peer_id=b.service.peer_id, swarm=SWARM, model_id="m", rg_version=reasoning_gym_version()),
                NodeMemory(inbox, intake, counters),
            )
            encoder = GroupEncoder(
                peer_id=a.service.peer_id, swarm=SWARM, model_id="m", rg_version=reasoning_gym_version()
            )
            assert b.service.network_group_of(a.service.peer_id) == "local"  # 127.0.0.1 is not routable
            assert await a.service.publish(encoder.frame(honest_group(0), 1))
            [message] = await receive_all(b, 1)
            send, receive = trio.open_memory_channel(1)
            await send.send(message)
            await send.aclose()
            await exchange.receive(receive)
            assert len(inbox) == 1
            # a second key that never connected shares nothing; one seen in the same group would
            inbox.standing.credit("elsewhere", time.time())
            inbox.standing.credit("neighbour", time.time())
            inbox.standing.locate("neighbour", "local")
            weights = inbox.standing.weights([a.service.peer_id, "neighbour", "elsewhere"])
            assert weights[a.service.peer_id] == weights["neighbour"] == weights["elsewhere"] / 2
            nursery.cancel_scope.cancel()
