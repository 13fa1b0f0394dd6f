"""What the network hands the node, one `Arrival` at a time on one memory channel: a peer's
bytes, whose they are, when they came and by which route. The node's intake checks every route
the same way; the route says which check to run (a log-probs message is not a group).

- `route="gossip"`: a message on one of our topics, signed by `sender` (libp2p checked the
  signature), each message once (gossip.py remembers ids to drop repeats). `topic` says which.
- `route="fetch"`: a group `sender` served us when we asked it on `/sapo/groups/1`
  (group_fetch.py). Noise authenticated the stream's peer, and the intake refuses a group whose
  origin is anyone else (`sender_mismatch`), so no one can serve another's group. No topic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Route = Literal["gossip", "fetch"]


@dataclass(frozen=True)
class Arrival:
    sender: str  # base58 peer id of the author: the signer, or the peer we asked
    data: bytes
    received_at: float  # time.time() when it reached this node
    route: Route
    topic: str | None = None  # the topic a gossip message came on; None for a fetched group

    @classmethod
    def fetched(cls, author: str, frame: bytes, received_at: float) -> Arrival:
        return cls(author, frame, received_at, "fetch")

    @classmethod
    def gossiped(cls, signer: str, data: bytes, received_at: float, topic: str) -> Arrival:
        return cls(signer, data, received_at, "gossip", topic)


class ArrivalSink(Protocol):
    """Where the network puts what arrives: a memory channel's send end, or ArrivalQueues
    (arrival_queues.py). Never blocks: trio.WouldBlock when full (the network drops and counts)."""

    def send_nowait(self, arrival: Arrival) -> None: ...


__all__ = ["Arrival", "ArrivalSink", "Route"]
