"""A program tests/protocol/test_pubsub_streams.py runs inside a network namespace of its own:
two real networks on that namespace's 127.0.0.1, A dialling B, whose link stalls right after it
comes, so that A's first pubsub stream to B fails; then it watches whether A ever sends to B.

The stall is the kernel's: the moment A's host says the link is up (a libp2p network notifee,
which runs before any of the link's streams has sent a byte), an nftables rule in this namespace
drops every TCP packet to and from B's port, and STALL_SECONDS later the rule goes. TCP
retransmits, so the link survives, as it does on a loaded machine whose loop stalls (the 32-node
bench's "fail to upgrade mux" and timed-out pubsub opens). The pubsub stream's protocol
negotiation times out after the host's 10 s meanwhile.

    ip netns exec NS python -m tests.support.stalled_pubsub_open on|off

`off` runs the networks without protocol/reach/pubsub_streams.py (its loop does nothing), as
py-libp2p 0.8.1 alone would. It prints one JSON object: seconds from the link coming to the
moment B was in A's `pubsub.peers` (None if never), whether B was there when the stall ended,
whether the link lasted, whether B received what A published, and A's counters.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import trio
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from sapo.protocol.reach import pubsub_streams
from tests.support.gossip import TOPIC, start_node

STALL_SECONDS = 12.0  # past the host's 10 s stream negotiation timeout
# How long after the link came A is watched: the loop's first pass after MIN_LINK_SECONDS, at
# most one CHECK_SECONDS later, and a little for the open itself.
WATCH_SECONDS = pubsub_streams.MIN_LINK_SECONDS + pubsub_streams.CHECK_SECONDS + 3.0
TABLE = "stalled_pubsub_open"


def nft(script: str) -> None:
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True, capture_output=True, timeout=10)


class StallOnConnect:
    """A libp2p network notifee: when the link to `peer` comes, drop its port's packets at once
    (synchronously: no task of the loop runs, so nothing of the link is sent, until the rule is in)."""

    def __init__(self, peer: Any, port: int) -> None:
        self.peer, self.port = peer, port
        self.stalled_at: float | None = None
        self.stalled = trio.Event()

    async def connected(self, network: Any, conn: Any) -> None:
        if conn.muxed_conn.peer_id == self.peer and self.stalled_at is None:
            rules = [f"add rule inet {TABLE} input tcp {end} {self.port} drop" for end in ("dport", "sport")]
            nft("\n".join(rules) + "\n")
            self.stalled_at = trio.current_time()
            self.stalled.set()

    async def disconnected(self, network: Any, conn: Any) -> None:
        return None

    async def opened_stream(self, network: Any, stream: Any) -> None:
        return None

    async def closed_stream(self, network: Any, stream: Any) -> None:
        return None

    async def listen(self, network: Any, multiaddr: Any) -> None:
        return None

    async def listen_close(self, network: Any, multiaddr: Any) -> None:
        return None


async def idle(self: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    await trio.sleep_forever()


async def scenario() -> dict:
    nft(f"add table inet {TABLE}\nadd chain inet {TABLE} input {{ type filter hook input priority 0 ; }}\n")
    result: dict[str, Any] = {}
    with trio.fail_after(WATCH_SECONDS + 30):
        async with trio.open_nursery() as nursery:
            b = await start_node(nursery)
            a = await start_node(nursery)
            b_id = b.service.my_id
            stall = StallOnConnect(b_id, int(Multiaddr(b.addr).value_for_protocol("tcp")))
            a.service.host.get_network().register_notifee(stall)
            await a.service.host.connect(info_from_p2p_addr(Multiaddr(b.addr)))
            await stall.stalled.wait()
            linked = True
            joined = None
            while (now := trio.current_time() - stall.stalled_at) < WATCH_SECONDS:
                if now >= STALL_SECONDS and "at_stall_end" not in result:
                    nft(f"flush chain inet {TABLE} input\n")
                    result["at_stall_end"] = b_id in a.service.pubsub.peers
                if joined is None and b_id in a.service.pubsub.peers:
                    joined = round(now, 1)
                linked = linked and b.service.peer_id in a.service.connected_peers()
                if joined is not None and now >= STALL_SECONDS:
                    break
                await trio.sleep(0.1)
            result["joined_after_s"] = joined
            result["linked_throughout"] = linked
            result["received"] = await published_reaches(a, b) if joined is not None else False
            result["counters"] = {k: v for k, v in a.counters.items() if k.startswith("pubsub_streams")}
            nursery.cancel_scope.cancel()
    return result


async def published_reaches(a: Any, b: Any) -> bool:
    """Whether a message A publishes reaches B, once A has heard B subscribe (B opens its own
    stream to A again the same way) and B is in A's mesh."""
    try:
        with trio.fail_after(15):
            await a.service.pubsub.wait_for_subscription(b.service.my_id, TOPIC, timeout=15)
            await a.service.pubsub.wait_for_mesh(b.service.my_id, TOPIC, timeout=15)
            assert await a.service.publish(b"after the stall")
            while (await b.inbox.receive()).data != b"after the stall":
                pass
            return True
    except trio.TooSlowError:
        return False


def main() -> None:
    if sys.argv[1:] == ["off"]:
        pubsub_streams.PubsubStreams.run = idle  # type: ignore[method-assign]
    elif sys.argv[1:] != ["on"]:
        raise SystemExit("usage: python -m tests.support.stalled_pubsub_open on|off")
    try:
        print(json.dumps(trio.run(scenario)))
    finally:
        subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True, timeout=10)


if __name__ == "__main__":
    main()
