"""What a node counts about its traffic: received, accepted, rejected by reason, published."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sapo.sampling.strategies import PEER_LIMIT

# Gossip-layer counters that are refusals of a peer's message (the rest are our own sends).
TRANSPORT_REJECTIONS = (
    "malformed_frame",
    "malformed_message",
    "oversized",
    "duplicate",
    "not_allowed",
    "unsigned",
    "bad_signature",
    "rate_limited",  # over the author's token bucket (protocol/peers/peer_guard.py)
    "replayed",  # an author's sequence number at or below its highest, over its own bucket: dropped, charged to no one
    "banned",  # from, or relayed by, a banned peer; or its connection refused
)


class RecentPeerCounts(Counter):
    """A Counter of at most `limit` peers: counting a peer makes it the newest, and counting one
    more than `limit` forgets the one counted longest ago. A node that runs for months meets peers
    without end, and its round records, page and metrics carry one entry per counted peer; by
    default it counts as many peers as the sampler keeps state for."""

    def __init__(self, limit: int = PEER_LIMIT) -> None:
        self.limit = limit
        super().__init__()

    def __setitem__(self, peer: str, count: int) -> None:
        super().pop(peer, None)  # dicts keep insertion order: newest last
        super().__setitem__(peer, count)
        if len(self) > self.limit:
            del self[next(iter(self))]


@dataclass
class NodeCounters:
    received: int = 0
    accepted: int = 0
    published: int = 0
    rejected: Counter = field(default_factory=Counter)
    transport: dict[str, int] = field(default_factory=dict)  # the gossip layer's own counts
    accepted_from: RecentPeerCounts = field(default_factory=RecentPeerCounts)  # verified groups per sending peer
    # peers' shared log-probs: received (messages), joined (to their group), late, unmatched, mismatched
    logprobs: Counter = field(default_factory=Counter)

    def all_rejections(self) -> dict[str, int]:
        """Refusals by reason, from the intake checks and from the gossip layer below them."""
        merged = Counter(self.rejected)
        for reason in TRANSPORT_REJECTIONS:
            if self.transport.get(reason):
                merged[reason] += self.transport[reason]
        return dict(merged)

    def to_json(self) -> dict[str, Any]:
        """The counts as JSON (a study's run checkpoint keeps them: its round records carry them)."""
        return {
            "received": self.received,
            "accepted": self.accepted,
            "published": self.published,
            "rejected": dict(self.rejected),
            "transport": dict(self.transport),
            "accepted_from": list(self.accepted_from.items()),  # oldest first, as counted
            "logprobs": dict(self.logprobs),
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Take the counts `to_json` saved, in place (the intake and the exchange hold this object)."""
        self.received, self.accepted, self.published = saved["received"], saved["accepted"], saved["published"]
        self.rejected = Counter(saved["rejected"])
        self.transport = dict(saved["transport"])
        self.accepted_from = RecentPeerCounts(self.accepted_from.limit)
        for peer, count in saved["accepted_from"]:
            self.accepted_from[peer] = count
        self.logprobs = Counter(saved["logprobs"])
