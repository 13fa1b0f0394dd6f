"""h-atk6, question 1: whose young links does `make_room` close when a stranger spreads its own
thin? Run inside a network namespace of its own (11.0.0.0/8 on its loopback, public /16s):

    unshare -n sh -c 'ip link set lo up && ip addr add 11.0.0.1/8 dev lo && \
        exec .venv/bin/python -m tests.hardening.room_eviction SPREAD'

SPREAD is the stranger's links per /16 (1, 3, or 34: all in one /16, the case #41's test covers).
Honest peers connect first and stay: BUSY links from one /16 (a cloud region's newcomers, or an
author's fetchers) and LONE links each from a /16 of its own; LATE lone newcomers come once the
attack runs. The stranger remakes its links every CHURN s, before they are counted. Nothing here
is trimmed (high 200, a 60 s grace): every close is `make_room`'s. It prints one JSON line.

Scaled down as many_groups.py is: SLOTS inbound slots instead of 250 (one in 16 kept free: 3).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr

from sapo.protocol.reach import connections
from sapo.protocol.toolkit.hosts import new_noise_host, open_peers
from tests.hardening.many_groups import churn, from_address
from tests.hardening.zombie_links import LOOPBACK, cut_slots, slots_held
from tests.support.gossip import start_node

SLOTS = 48
STRANGER_LINKS = 34  # with the honest ones, more than SLOTS - 3 held: every arrival makes room
BUSY, LONE, LATE = 4, 4, 4
CHURN = 3.0
ATTACK_SECONDS = 12.0


async def stay(target: Any, source: str, up: list[str], name: str) -> None:
    """A fresh key on `source` that connects once and stays; `name` is in `up` while its link is."""
    host = from_address(new_noise_host(create_new_key_pair(), [LOOPBACK]), source)
    async with host.run([LOOPBACK]):
        try:
            with trio.fail_after(10):
                await host.connect(target)
        except Exception:  # noqa: BLE001 - refused
            return
        up.append(name)
        while target.peer_id in open_peers(host):
            await trio.sleep(0.05)
        up.remove(name)
        await trio.sleep_forever()


async def main(spread: int) -> dict[str, Any]:
    connections.GRACE_SECONDS, connections.CHECK_SECONDS = 60.0, 1.0
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            victim = await start_node(nursery, discover_peers=0, connections_low=100, connections_high=200)
            host = victim.service.host
            cut_slots(host, SLOTS)
            target = info_from_p2p_addr(multiaddr.Multiaddr(victim.addr))
            up: list[str] = []
            for i in range(BUSY):
                nursery.start_soon(stay, target, f"11.200.0.{i + 1}", up, f"busy{i}")
            for i in range(LONE):
                nursery.start_soon(stay, target, f"11.{210 + i}.0.1", up, f"lone{i}")
            await trio.sleep(2.0)
            before = sorted(up)
            made = [0]
            for n in range(STRANGER_LINKS):
                group, member = (n // spread, n % spread)
                nursery.start_soon(churn, target, f"11.{20 + group}.0.{member + 1}", CHURN, made)
            await trio.sleep(ATTACK_SECONDS / 2)
            for i in range(LATE):
                nursery.start_soon(stay, target, f"11.{230 + i}.0.1", up, f"late{i}")
            held = []
            for _ in range(int(ATTACK_SECONDS / 2 / 0.25)):
                await trio.sleep(0.25)
                held.append(slots_held(host))
            result = {
                "stranger_links_per_16": spread,
                "stranger_16s": -(-STRANGER_LINKS // spread),
                "honest_up_before": len(before),
                "busy_kept": sum(n.startswith("busy") for n in up),
                "lone_kept": sum(n.startswith("lone") for n in up),
                "late_kept": sum(n.startswith("late") for n in up),
                "of_each": [BUSY, LONE, LATE],
                "stranger_links_made": made[0],
                "slots": SLOTS,
                "slots_held_most": max(held),
            }
            nursery.cancel_scope.cancel()
    return result


if __name__ == "__main__":
    print(json.dumps(trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 1)), flush=True)
