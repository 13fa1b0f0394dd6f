"""h-atk6, questions 1 and 2: what one arrival at a node short of inbound slots costs it, and what
a bare TCP connect (no key, no handshake byte) makes it close.

A node holds LINKS young links (GRACE set long, so none is counted), each from an address of its
own on 127.0.1.0/24 ("local": every address is its own place); a second process holds them. Then
another process opens FLOOD bare TCP connections, each closed at once, first while the node has
room (`short_of_slots` says no), then while it is short (LINKS of 250 held). It prints one JSON
line: `young_inbound`'s cost a call at LINKS open links (walking every link, and from the list
it keeps up to a second), the node's CPU a bare arrival in each case, and the young links the
short run closed (none since room is made only once an arrival has finished its handshake).

    nice -n 5 .venv/bin/python -m tests.hardening.room_cost
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from typing import Any

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr

from sapo.protocol.reach import connections
from sapo.protocol.toolkit.hosts import new_noise_host, open_peers
from tests.hardening.many_groups import from_address
from tests.hardening.zombie_links import LOOPBACK, slots_held
from tests.support.gossip import start_node

LINKS = 245
FLOOD = 100


async def hold_links(address: str) -> None:
    """LINKS fresh keys, each from 127.0.1.<n>, connected to `address` until killed."""
    target = info_from_p2p_addr(multiaddr.Multiaddr(address))

    async def one(n: int) -> None:
        host = from_address(new_noise_host(create_new_key_pair(), [LOOPBACK]), f"127.0.1.{n + 1}")
        async with host.run([LOOPBACK]):
            with trio.fail_after(60):
                await host.connect(target)
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        for n in range(LINKS):
            nursery.start_soon(one, n)
            await trio.sleep(0.02)


def flood(port: int) -> None:
    """FLOOD bare TCP connections from 127.0.0.2, each closed at once, 200 a second."""
    for _ in range(FLOOD):
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", port))
        s.close()
        time.sleep(0.005)


async def flood_cost(port: int) -> float:
    """The node's CPU seconds a bare arrival, over one flood (and a second to settle after)."""
    before = time.process_time()
    await trio.to_thread.run_sync(
        subprocess.run, [sys.executable, "-m", "tests.hardening.room_cost", "flood", str(port)]
    )
    await trio.sleep(1.0)
    return (time.process_time() - before) / FLOOD


async def main() -> dict[str, Any]:
    connections.GRACE_SECONDS = 10_000.0
    result: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        victim = await start_node(nursery, discover_peers=0, connections_low=500, connections_high=1000)
        host = victim.service.host
        room = host.inbound_room
        room.short_of_slots = lambda: False  # while the links are made: no make_room
        holder = subprocess.Popen([sys.executable, "-m", "tests.hardening.room_cost", "hold", victim.addr])
        try:
            with trio.fail_after(240):
                while len(open_peers(host)) < LINKS:
                    await trio.sleep(2.0)
                    print("links", len(open_peers(host)), "slots", slots_held(host), file=sys.stderr, flush=True)
            await trio.sleep(2.0)
            links = victim.service.links
            calls = 200
            start = time.perf_counter()
            for _ in range(calls):
                links._young = None  # walk every link each time
                young = links.young_inbound()
            result["young_links"] = len(young)
            result["young_inbound_ms_a_walk"] = round((time.perf_counter() - start) / calls * 1000, 3)
            start = time.perf_counter()
            for _ in range(calls):
                links.young_inbound()
            result["young_inbound_ms_a_call_kept"] = round((time.perf_counter() - start) / calls * 1000, 3)
            port = int(multiaddr.Multiaddr(victim.addr).value_for_protocol("tcp"))
            result["cpu_ms_a_bare_arrival_with_room"] = round(await flood_cost(port) * 1000, 3)
            room.short_of_slots = lambda: True  # LINKS of 250 held: short of slots
            result["slots_held_before_short_flood"] = slots_held(host)
            result["cpu_ms_a_bare_arrival_short"] = round(await flood_cost(port) * 1000, 3)
            result["young_links_after_short_flood"] = len(links.young_inbound())
            result["bare_connects"] = FLOOD
        finally:
            holder.kill()
            nursery.cancel_scope.cancel()
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["hold"]:
        trio.run(hold_links, sys.argv[2])
    elif sys.argv[1:2] == ["flood"]:
        flood(int(sys.argv[2]))
    else:
        print(json.dumps(trio.run(main)), flush=True)
