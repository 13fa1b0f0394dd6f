"""What gossip hands the node: each new message from another peer once, as an `Arrival` by the
gossip route on a memory channel (protocol/exchange/arrivals.py), and no message over the size limit.

The network (network.py) builds the host and pubsub around these; everything there works around
measured sharp edges of py-libp2p 0.8.1 (see protocol/README.md, "Transport").
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from sapo.protocol.exchange.arrivals import Arrival, ArrivalSink
from sapo.protocol.toolkit.hosts import peer_str
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.protocol.toolkit.recent import RecentByAuthor
from sapo.protocol.wire.group_wire import PROTOCOL_ID as GROUPS_PROTOCOL_ID
from sapo.training.bounded import BoundedMap

logger = logging.getLogger("sapo.gossip")

# How many message ids we remember to drop replays (a rejoining peer is replayed 4-50 old ones),
# per author and in all: one author's flood pushes out only its own (protocol/toolkit/recent.py). An
# author publishing at the gossip limit (50/s) fills its share in ~5 minutes; what is older than
# that reaches the intake, whose own per-author memories cover the whole age window.
SEEN_IDS = 65_536
SEEN_IDS_PER_AUTHOR = 16_384
# Authors whose groups came on the rollouts topic lately (an older release, or a 0.4.0 node
# beside one) are not asked to fetch: the topic brings their groups anyway (group_fetch.py).
GOSSIPING_AUTHORS = 4096
GOSSIPING_SECONDS = 120.0


class Delivery:
    """Hands other peers' messages to `incoming`, each once, never blocking the network: a full
    channel drops and counts (`inbox_channel_full`). `topics[0]` is the rollouts topic."""

    def __init__(
        self,
        my_id: ID,
        topics: tuple[str, ...],
        incoming: ArrivalSink,
        count: Callable[[str], None],
    ) -> None:
        self.my_id = my_id
        self.topics = topics
        self.incoming = incoming
        self.count = count
        self.seen: RecentByAuthor[None] = RecentByAuthor(SEEN_IDS_PER_AUTHOR, SEEN_IDS)
        self._gossiping: BoundedMap[bytes, float] = BoundedMap(GOSSIPING_AUTHORS)  # author -> last group on the topic

    def gossips(self, author: bytes, now: float) -> bool:
        """Whether `author`'s groups came on the rollouts topic within GOSSIPING_SECONDS."""
        return now - self._gossiping.get(author, -math.inf) < GOSSIPING_SECONDS

    def deliver(self, msg: rpc_pb2.Message, message_id: bytes) -> None:
        if msg.from_id == self.my_id.to_bytes():
            return  # our own publish looping through push_msg
        # libp2p forgets seen ids after 120 s and replays its message cache to peers that
        # rejoin; remember more, for longer, so the application sees each message once.
        if self.seen.contains(msg.from_id, message_id):
            self.count("duplicate")
            return
        now = time.time()
        self.seen.put(msg.from_id, message_id, None, stamp=now, now=now)
        if self.topics[0] in msg.topicIDs:
            self._gossiping.put(msg.from_id, now)
        self.count("received")
        topic = next((t for t in msg.topicIDs if t in self.topics), self.topics[0])
        received = Arrival.gossiped(peer_str(msg.from_id), bytes(msg.data), time.time(), topic)
        self.hand(received)

    def hand(self, received: Arrival) -> None:
        """Pass one arrival on to the node; a full channel drops and counts. Fetched groups
        (group_fetch.py) come this way too, so the node reads one stream of arrivals."""
        try:
            # Never block the network on a slow consumer: drop and count instead.
            self.incoming.send_nowait(received)
        except trio.WouldBlock:
            self.count("inbox_channel_full")
            logger.debug("inbox full: dropped a %s arrival from %s", received.route, received.sender)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.count("inbox_closed")


def size_validator(max_bytes: int, my_id: ID, gate: PeerGate) -> Callable[[ID, rpc_pb2.Message], bool]:
    """A topic validator: runs before a message is forwarded or delivered, so an oversized one
    goes no further, and its author pays."""

    def validate(forwarder: ID, msg: rpc_pb2.Message) -> bool:
        if len(msg.data) > max_bytes:
            gate.count("oversized")
            if msg.from_id != my_id.to_bytes():  # signature already checked: the author pays
                gate.penalize(ID(msg.from_id), "oversized")
            logger.warning(
                "rejected %d-byte message from %s (forwarded by %s): over max_message_bytes=%d",
                len(msg.data),
                peer_str(msg.from_id),
                forwarder,
                max_bytes,
            )
            return False
        return True

    return validate


def is_legacy(gate: PeerGate, gossip_protocol: str, peer: ID) -> bool:
    """A release before 0.4.0: it gossips groups and cannot serve them (identify says so)."""
    return gate.lacks(peer, GROUPS_PROTOCOL_ID) and not gate.lacks(peer, gossip_protocol)


def unasked_groups(topic: str, is_legacy: Callable[[ID], bool]) -> Callable[[rpc_pb2.Message], bool]:
    """Whether a message is a group on the rollouts `topic` that nobody asked for, in fetch mode:
    a node asks for the groups it uses, so only an older release, which can only gossip
    (`is_legacy`: connected, identify lists gossip but not `/sapo/groups/1`), has a reason to put
    one there. The guarded pubsub asks this first, before any signature check or any state is
    kept for the author: a refused group costs us a lookup, is not forwarded, and is charged to
    nobody (a 0.4.0 node beside an older release publishes there in good faith)."""

    def unasked(msg: rpc_pb2.Message) -> bool:
        return topic in msg.topicIDs and not is_legacy(ID(msg.from_id))

    return unasked


__all__ = ["Delivery", "is_legacy", "size_validator", "unasked_groups"]
