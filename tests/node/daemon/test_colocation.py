"""Keys behind one network address group share one standing: over real libp2p on loopback, the
exchange places an accepted group's author by its direct connection ("local" for every
unroutable address, as reachability counts them) or, reached only through a relay, by its relay's,
and the standing weighs it with its neighbours. In fetch mode an older release's group on the
topic places its author with every other older release's, wherever it connects from."""

from __future__ import annotations

import pytest
import trio

from sapo.node.core.counters import NodeCounters
from sapo.node.core.exchange import GossipExchange, GroupEncoder
from sapo.node.core.intake import node_intake
from sapo.node.core.memory import NodeMemory
from sapo.node.core.node import node_inbox
from sapo.node.core.settings import load_settings
from sapo.protocol.exchange.arrivals import Arrival
from sapo.protocol.wire.group_wire import PROTOCOL_ID
from sapo.sampling.standing import OLDER_RELEASES_PLACE, Provenance
from sapo.training.problems.rewards import score_group
from sapo.training.problems.tasks import reasoning_gym_version
from tests.support.gossip import SWARM, TOPIC, receive_all, start_node, wait_for_mesh
from tests.support.groups import honest_group
from tests.support.relay import PRIVATE, dial_through_relay, kinds, wait_until


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
            # a key seen in the same group shares its budget; one whose place is not known shares
            # the budget of every such key ("unknown"), not a place of its own
            [[author, now, *_]] = inbox.standing.to_json()["newcomers"]  # when a's clock started
            assert author == a.service.peer_id
            inbox.standing.credit("neighbour", now, Provenance(place="local"))
            inbox.standing.credit("elsewhere", now)
            weights = inbox.standing.weights([a.service.peer_id, "neighbour", "elsewhere", "unplaced"], now)
            assert weights[a.service.peer_id] == weights["neighbour"]
            # each place weighs what one newcomer alone would (0.1 / 4): two keys in it split that
            alone = settings.trust.newcomer_share / 4
            assert weights[a.service.peer_id] + weights["neighbour"] == pytest.approx(alone)
            assert weights["elsewhere"] == weights["unplaced"] == pytest.approx(alone / 2)
            nursery.cancel_scope.cancel()


async def test_a_relayed_author_is_placed_by_its_relay():
    """A peer reached only through a relay has no IP of its own to place it by: it is placed by
    its relay's network group, so keys behind one relay share one budget."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            relay = await start_node(nursery, relay="on", reachability="public")
            a = await start_node(nursery, peers=[relay.addr], **PRIVATE)
            b = await start_node(nursery, peers=[relay.addr], **PRIVATE)
            await wait_until(lambda: a.service.status().relayed_addrs and b.service.status().relayed_addrs, 20)
            await dial_through_relay(a, b)
            await wait_until(lambda: kinds(b, a) == {True}, 30)
            assert b.service.network_group_of(a.service.peer_id) == "via local"  # the relay is on 127.0.0.1
            assert b.service.network_group_of(relay.service.peer_id) == "local"
            assert b.service.network_group_of("QmNotConnected") is None
            nursery.cancel_scope.cancel()


async def test_only_a_group_the_node_asked_for_earns_its_author_standing():
    """In fetch mode a group fetched from its author earns; one on the topic from a 0.4.0 author
    (which the guarded pubsub refuses before any check) would earn nothing even if it got through;
    with --exchange gossip the topic is how every author's groups come, and they earn."""
    settings = load_settings({"model": "tiny", "tasks": ["basic_arithmetic"], "swarm": SWARM})
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, exchange="fetch")
            fetching = await start_node(nursery, peers=[a.addr], exchange="fetch")
            gossiping = await start_node(nursery, peers=[a.addr], exchange="gossip")
            for node in (fetching, gossiping):  # a place is known only for a connected author
                await wait_until(lambda node=node: a.service.peer_id in node.service.connected_peers(), 10)
            exchanges = {}
            for node in (fetching, gossiping):
                exchanges[node] = GossipExchange(
                    node.service,
                    GroupEncoder(peer_id=node.service.peer_id, swarm=SWARM, model_id="m", rg_version="v"),
                    NodeMemory(node_inbox(settings), None, NodeCounters()),
                )
            author = a.service.peer_id
            fetched = exchanges[fetching].provenance(Arrival.fetched(author, b"", 0.0))
            pushed = exchanges[fetching].provenance(Arrival.gossiped(author, b"", 0.0, TOPIC))
            gossiped = exchanges[gossiping].provenance(Arrival.gossiped(author, b"", 0.0, TOPIC))
            assert fetched.asked and not pushed.asked and gossiped.asked
            assert fetched.place == pushed.place == gossiped.place == "local"
            nursery.cancel_scope.cancel()


async def test_an_older_releases_group_on_the_topic_is_placed_with_every_older_release():
    """A fetching node takes an older release's own group on the topic by right (it cannot be
    fetched), and it earns; but anyone can claim to be an older release (identify without
    `/sapo/groups/1`), so its author is placed in OLDER_RELEASES_PLACE, not in its network group:
    every key that claims it weighs one author's worth together. Its group fetched (once it has
    upgraded) places it by its connection again. The older release here is a gossiping network
    whose `/sapo/groups/1` handler is removed (tests/protocol/test_older_releases.py)."""
    settings = load_settings({"model": "tiny", "tasks": ["basic_arithmetic"], "swarm": SWARM})
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            old = await start_node(nursery, exchange="gossip")
            old.service.host.remove_stream_handler(PROTOCOL_ID)
            node = await start_node(nursery, peers=[old.addr], exchange="fetch")
            author = old.service.peer_id
            await wait_until(lambda: node.service.by_right(author) == "older", 10)
            await wait_for_mesh([node, old])
            inbox, counters = node_inbox(settings), NodeCounters()
            intake = node_intake(
                settings,
                counters,
                peer_id=node.service.peer_id,
                rg_version=reasoning_gym_version(),
                verifier=score_group,
            )
            exchange = GossipExchange(
                node.service,
                GroupEncoder(
                    peer_id=node.service.peer_id, swarm=SWARM, model_id="m", rg_version=reasoning_gym_version()
                ),
                NodeMemory(inbox, intake, counters),
            )
            encoder = GroupEncoder(peer_id=author, swarm=SWARM, model_id="m", rg_version=reasoning_gym_version())
            assert await old.service.publish(encoder.frame(honest_group(0), 1))
            [message] = await receive_all(node, 1)
            assert (message.route, message.sender) == ("gossip", author)
            send, receive = trio.open_memory_channel(1)
            await send.send(message)
            await send.aclose()
            await exchange.receive(receive)
            assert len(inbox) == 1 and counters.accepted == 1
            [[credited, now, _last, _groups, _dropped, place]] = inbox.standing.to_json()["newcomers"]
            assert (credited, place) == (author, OLDER_RELEASES_PLACE)
            assert node.service.network_group_of(author) == "local"  # where it connects from, unused
            # a second key claiming the same shares the place: the two weigh one author's worth
            inbox.standing.credit("another-older", now, Provenance(place=OLDER_RELEASES_PLACE))
            weights = inbox.standing.weights([author, "another-older"], now + 3600)
            assert weights[author] + weights["another-older"] == pytest.approx(1.0)
            assert exchange.provenance(Arrival.fetched(author, b"", 0.0)).place == "local"
            nursery.cancel_scope.cancel()
