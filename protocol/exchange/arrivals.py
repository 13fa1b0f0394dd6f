"""What the network hands the node, one `Arrival` at a time on one memory channel, each saying by
which route it came: a gossip message (`GossipMessage`, signed by its author, on a topic) or a
group its author served us when asked (`FetchedGroup`). The node's intake checks both the same
way; the route says which check to run (a log-probs message is not a group) and whom to charge.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GossipMessage:
    """One message from another peer, signature already verified by libp2p, each once (gossip.py
    remembers message ids to drop repeats; the node needs no id)."""

    sender: str  # base58 peer id of the signer (the message's `from` field)
    data: bytes
    received_at: float  # time.time() when it reached this node
    topic: str  # the topic it came on (the rollouts topic, unless the network was given others)


@dataclass(frozen=True)
class FetchedGroup:
    """One group's frame as its author answered our request on `/sapo/groups/1` (group_fetch.py).
    `author` is the stream's peer, which Noise authenticated; the intake refuses a group whose
    origin is anyone else (`sender_mismatch`), so no one can serve another's group."""

    author: str  # base58 peer id
    frame: bytes
    received_at: float  # time.time() when it reached this node


Arrival = GossipMessage | FetchedGroup

__all__ = ["Arrival", "FetchedGroup", "GossipMessage"]
