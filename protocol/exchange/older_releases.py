"""Older releases, which only gossip groups, and the rollouts topic as a channel to them alone.

Why: a release before 0.4.0 cannot fetch (`/sapo/groups/1`); it reads groups on the rollouts
topic. A node of this release publishes its groups there only for such peers. Once, any
connected peer whose identify left out `/sapo/groups/1` made a node publish every group to its
whole mesh, and every other node check every copy: one stranger connected to every node turned
the swarm back into 0.3.0's flood (issue #41). Now:

- **Who reads.** An older release gets our groups on the topic only once it is *established*:
  connected for LEGACY_AFTER_SECONDS, and an author of a group our intake accepted, within
  HEARD_SECONDS, that it signed itself. That costs what an honest 0.3.0 node does anyway (it
  publishes its groups every round); a stranger that connects and says it cannot fetch costs us
  nothing, and one that publishes must make groups that pass every check.
- **Only to them, and only ours.** In fetch mode our router sends our own groups on the rollouts
  topic only to at most MAX_READERS established older releases subscribed to it (the most
  recently heard), never to the mesh, skips a reader whose send queue is backed up, and keeps no
  copy in the message cache, so nobody else is offered it (IHAVE) or can ask for it (IWANT). It
  forwards nobody else's message on that topic: a stranger posing as an older release cannot
  make a node an amplifier of its own messages (an attack on issue #41's first version had one
  key's 40 messages leave a node 520 times, and 8 stalled readers hold 204 MB). Nodes of this
  release refuse such a group unasked anyway (pubsub_guards.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from libp2p.peer.id import ID
from libp2p.peer.peerstore import env_to_send_in_RPC
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2

from sapo.protocol.exchange.gossip import is_legacy
from sapo.protocol.toolkit.hosts import connected_seconds, open_peers
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.training.bounded import BoundedMap

# A stranger claiming to be an older release must stay this long before our groups go to it.
LEGACY_AFTER_SECONDS = 30.0
# ...and have had a group of its own accepted this recently (an honest one publishes each round).
HEARD_SECONDS = 600.0
# Older releases whose accepted groups we remember; the least recent make way.
MAX_HEARD = 1024
# Older releases our groups go to at once (the most recently heard): GossipSub sends a message to
# at most D_high (12) peers; one copy each to more readers than that would make strangers who
# publish a group every 10 minutes a fan-out of ours.
MAX_READERS = 8
# A reader whose send queue holds this many RPCs is skipped: a reader that stops reading (a
# stalled process) costs us a few of our groups' bytes, not a copy of every group we publish.
MAX_QUEUED = 4


class OlderReleases:
    """Which connected peers are established older releases (`readers`), from what identify says
    (`gate.lacks`) and what the intake accepted (`heard`)."""

    def __init__(self, host: Any, gate: PeerGate, gossip_protocol: str, clock: Callable[[], float] = time.time):
        self.host = host
        self.gate = gate
        self.gossip_protocol = gossip_protocol
        self.clock = clock
        self._heard: BoundedMap[ID, float] = BoundedMap(MAX_HEARD)  # author -> when a group of its own was accepted

    def is_older(self, peer: ID) -> bool:
        """Connected now, and identify lists gossip but not `/sapo/groups/1` (what identify said
        is remembered for a while after a peer leaves; a departed one is nobody's older release)."""
        connections = self.host.get_network().get_connections(peer)
        return any(not c.is_closed for c in connections) and is_legacy(self.gate, self.gossip_protocol, peer)

    def heard(self, author: str) -> None:
        """The intake accepted a group `author` signed and put on the rollouts topic."""
        try:
            peer = ID.from_base58(author)
        except Exception:  # noqa: BLE001 - gossip only hands out ids libp2p decoded
            return
        if self.is_older(peer):
            self._heard.put(peer, self.clock())

    def readers(self) -> list[ID]:
        """The established older releases connected now, at most MAX_READERS of them, the most
        recently heard first: those our groups go on the topic for."""
        now = self.clock()
        heard = sorted(
            ((when, peer) for peer in open_peers(self.host) if (when := self._heard.get(peer)) is not None),
            key=lambda pair: pair[0],
            reverse=True,
        )
        return [
            peer
            for when, peer in heard
            if now - when < HEARD_SECONDS
            and self.is_older(peer)
            and connected_seconds(self.host, peer) >= LEGACY_AFTER_SECONDS
        ][:MAX_READERS]


class RolloutsForOlderReleases(GossipSub):
    """GossipSub, but a message on `rollouts_topic` goes only to `readers()` (in fetch mode);
    every other topic, and every topic in gossip mode (`readers` None), as GossipSub sends it."""

    def __init__(self, *args: Any, rollouts_topic: str, readers: Callable[[], Iterable[ID]] | None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rollouts_topic = rollouts_topic
        self.readers = readers

    async def publish(self, msg_forwarder: ID, pubsub_msg: rpc_pb2.Message) -> None:
        if self.readers is None or self.rollouts_topic not in pubsub_msg.topicIDs or self.pubsub is None:
            await super().publish(msg_forwarder, pubsub_msg)
            return
        pubsub = self.pubsub
        if pubsub_msg.from_id != pubsub.my_id.to_bytes():
            return  # only our own groups: we forward nobody's (older releases have their own mesh)
        # Not in the message cache: nobody else is offered it or may ask for it.
        subscribed = pubsub.peer_topics.get(self.rollouts_topic, set())
        to = [
            peer
            for peer in self.readers()
            if peer in subscribed and peer in pubsub.peers and len(pubsub.peer_queues.get(peer, ())) < MAX_QUEUED
        ]
        if not to:
            return
        rpc = rpc_pb2.RPC(publish=[pubsub_msg])
        rpc.senderRecord, _ = env_to_send_in_RPC(pubsub.host)
        for peer in to:
            self.send_rpc(peer, rpc)


__all__ = ["HEARD_SECONDS", "LEGACY_AFTER_SECONDS", "OlderReleases", "RolloutsForOlderReleases"]
