"""What a new author's message costs the network's event loop, however many authors it holds
(issue #41: "after 65,536 one-message authors, a new author's message costs <= 50 us").

Every gossip message's author, once libp2p has checked its signature, is charged to its bucket
(`PeerPolicy.admit_author`, peers/peer_guard.py) and, if new, remembered by the duplicate memory
(`Delivery.deliver`, exchange/gossip.py; toolkit/recent.py); both run on the loop. Before #40 the
duplicate memory scanned every author on each eviction (8.96 ms a message at 65,536 authors), and
the peer guard scanned past every banned peer (0.4 ms with 4,095 bans).

    python -m bench.author_memory                # 65,536 authors, and with 4,095 bans
    python -m bench.author_memory --smoke        # 2,000 authors, 100 bans: the smoke run

It fills the memories with one-message authors, then times `--probes` further new authors'
messages (admit + deliver), and prints the median and 99th percentile beside the same with only
1,000 authors held: one run, one comparison. The signature check (about 60 us of Ed25519 in
C, the same for every author) is not in it: it does not grow with the authors held.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from sapo.protocol.exchange.gossip import Delivery
from sapo.protocol.peers.peer_policy import PeerPolicy
from sapo.protocol.settings import NetworkSettings, rollout_topic

TOPIC = rollout_topic("bench")


def author(i: int) -> bytes:
    # an identity-multihash peer id's shape (0x00 0x24 ...): a real key's id is 38 bytes
    return b"\x00\x24\x08\x01\x12\x20" + i.to_bytes(32, "big")


def message(i: int) -> rpc_pb2.Message:
    return rpc_pb2.Message(from_id=author(i), seqno=(1).to_bytes(8, "big"), data=b"g" * 600, topicIDs=[TOPIC])


class Loop:
    """The two memories a message meets on the loop, as the network builds them."""

    def __init__(self) -> None:
        me = ID.from_pubkey(create_new_key_pair().public_key)
        self.counts: dict[str, int] = {}
        self.policy = PeerPolicy(NetworkSettings(swarm="bench"), me, self.count, on_ban=lambda peer: None)
        send, self.receive = trio.open_memory_channel(math.inf)
        self.delivery = Delivery(me, (TOPIC,), send, self.count)

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def one(self, i: int) -> None:
        msg = message(i)
        if self.policy.admit_author(msg, ID(msg.from_id)) is None:
            self.delivery.deliver(msg, msg.from_id + msg.seqno)
        while True:  # the node drains the channel; here it is simply emptied
            try:
                self.receive.receive_nowait()
            except trio.WouldBlock:
                break


def measure(authors: int, bans: int, probes: int) -> dict[str, float]:
    loop = Loop()
    for i in range(bans):
        loop.policy.guard.penalize(author(10**9 + i), "malformed_frame", times=10)
    for i in range(authors):
        loop.one(i)
    took = []
    for i in range(authors, authors + probes):
        started = time.perf_counter()
        loop.one(i)
        took.append(time.perf_counter() - started)
    took.sort()
    return {
        "authors": authors,
        "bans": bans,
        "median_us": 1e6 * statistics.median(took),
        "p99_us": 1e6 * took[min(len(took) - 1, int(0.99 * len(took)))],
        "banned_now": len(loop.policy.guard.banned()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--authors", type=int, default=65_536, help="one-message authors held before the probes")
    parser.add_argument("--bans", type=int, default=4_095, help="banned peers held beside them")
    parser.add_argument("--probes", type=int, default=2_000, help="new authors' messages timed")
    parser.add_argument("--smoke", action="store_true", help="2,000 authors, 100 bans, 200 probes")
    args = parser.parse_args(argv)
    if args.smoke:
        args.authors, args.bans, args.probes = 2_000, 100, 200
    rows = [
        measure(min(1_000, args.authors), 0, args.probes),
        measure(args.authors, 0, args.probes),
        measure(args.authors, args.bans, args.probes),
    ]
    print(f"{'authors held':>13} {'bans':>6} {'median us':>10} {'p99 us':>8} {'still banned':>13}")
    for row in rows:
        print(
            f"{row['authors']:>13,} {row['bans']:>6,} {row['median_us']:>10.1f} {row['p99_us']:>8.1f}"
            f" {row['banned_now']:>13,}"
        )
    worst = max(row["p99_us"] for row in rows)
    print(f"worst p99 {worst:.1f} us a new author's message (issue #41's bound: 50 us)")


if __name__ == "__main__":
    main()
