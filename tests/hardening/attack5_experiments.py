"""The measurements behind /work/attack-crowd.md (h-atk5): real hosts on 127.0.0.1, one process.

python -m tests.hardening.attack5_experiments zombie   # stuffed links closed by the manager
python -m tests.hardening.attack5_experiments idle     # the same with links that do read
python -m tests.hardening.attack5_experiments drop     # then the attacker leaves: drain, CPU
python -m tests.hardening.attack5_experiments maxconn  # zombies against max_connections
python -m tests.hardening.attack5_experiments stall    # 250 silent TCP connections
python -m tests.hardening.attack5_experiments shutdown # a node with stuffed links stops
"""

from __future__ import annotations

import resource
import sys
import time

import multiaddr
import trio
from libp2p.peer.peerinfo import info_from_p2p_addr

from sapo.protocol.reach import connections
from tests.hardening.zombie_links import Attacker, census, cut_slots, newcomer_gets_in, silent_connection
from tests.support.gossip import start_node

START = time.monotonic()


def log(*parts: object) -> None:
    print(f"{time.monotonic() - START:6.1f}s", *parts, flush=True)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def stuffed_victim(nursery, slots: int, *, stuff: bool = True, node_nursery=None):
    """A node (watermarks 1/2, grace 4 s) with `slots` inbound slots, all held by attackers whose
    links are stuffed (or idle), and past its grace: the manager has closed all but one."""
    connections.GRACE_SECONDS = 4.0
    connections.CHECK_SECONDS = 0.5
    victim = await start_node(node_nursery or nursery, connections_low=1, connections_high=2, discover_peers=0)
    cut_slots(victim.service.host, slots + 1)  # and the one kept free (inbound.py ROOM_SHARE)
    attackers = [Attacker(victim.addr) for _ in range(slots)]
    async with trio.open_nursery() as connecting:
        for attacker in attackers:
            connecting.start_soon(nursery.start, attacker.run)
    log("attackers connected", sum(a.connected for a in attackers), census(victim.service.host))
    if stuff:
        async with trio.open_nursery() as stuffing:
            for attacker in attackers:
                stuffing.start_soon(attacker.stuff, 2.0)
        log("KB sent a link:", [a.sent // 1024 for a in attackers])
    await trio.sleep(8)
    log("after trims:", census(victim.service.host), "closed", victim.counters.get("links_trimmed", 0))
    return victim, attackers


async def zombie(stuff: bool) -> None:
    async with trio.open_nursery() as nursery:
        victim, attackers = await stuffed_victim(nursery, 8, stuff=stuff)
        log("newcomer gets in:", await newcomer_gets_in(victim.addr))
        await trio.sleep(20)
        log("20 s later:", census(victim.service.host))
        nursery.cancel_scope.cancel()


async def drop() -> None:
    async with trio.open_nursery() as nursery:
        victim, attackers = await stuffed_victim(nursery, 4)
        for attacker in attackers:
            await attacker.drop()
        began, spent = time.monotonic(), cpu()
        while census(victim.service.host)["slots"] and time.monotonic() - began < 300:
            await trio.sleep(10)
            log(f"attackers gone: {census(victim.service.host)}, cpu {cpu() - spent:.2f} s")
        nursery.cancel_scope.cancel()


async def maxconn() -> None:
    async with trio.open_nursery() as nursery:
        other = await start_node(nursery, discover_peers=0)
        connections.GRACE_SECONDS = 4.0
        victim = await start_node(nursery, connections_low=1, connections_high=2, discover_peers=0)
        host = victim.service.host
        cut_slots(host, 50)
        host.get_network().connection_config.max_connections = 8
        attackers = [Attacker(victim.addr) for _ in range(8)]
        async with trio.open_nursery() as connecting:
            for attacker in attackers:
                connecting.start_soon(nursery.start, attacker.run)
        async with trio.open_nursery() as stuffing:
            for attacker in attackers:
                stuffing.start_soon(attacker.stuff, 2.0)
        await trio.sleep(8)
        log("max_connections 8, after trims:", census(host))
        log("newcomer gets in:", await newcomer_gets_in(victim.addr))
        try:
            with trio.fail_after(10):
                await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(other.addr)))
            log("the node dials out: ok")
        except Exception as error:  # noqa: BLE001
            log("the node dials out: failed,", type(error).__name__)
        nursery.cancel_scope.cancel()


async def stall() -> None:
    async with trio.open_nursery() as nursery:
        victim = await start_node(nursery, discover_peers=0)
        port = int(multiaddr.Multiaddr(victim.addr).value_for_protocol("tcp"))
        opened = [0]
        async with trio.open_nursery() as attack:
            for _ in range(250):
                attack.start_soon(silent_connection, port, opened, 0.0)  # as fast as the node closes them
            await trio.sleep(2)
            got_in = tries = 0
            began, spent = time.monotonic(), cpu()
            while time.monotonic() - began < 30:
                tries += 1
                got_in += await newcomer_gets_in(victim.addr)
                await trio.sleep(1)
            log(
                f"30 s: newcomers in {got_in}/{tries}; silent connections {opened[0]}; cpu {cpu() - spent:.1f} s",
                census(victim.service.host),
            )
            attack.cancel_scope.cancel()
        began = time.monotonic()
        while not await newcomer_gets_in(victim.addr):
            await trio.sleep(0.5)
        log(f"attack stopped: a newcomer got in after {time.monotonic() - began:.1f} s")
        nursery.cancel_scope.cancel()


async def shutdown() -> None:
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as node:
            victim, _ = await stuffed_victim(outer, 8, node_nursery=node)
            began = time.monotonic()
            node.cancel_scope.cancel()
        log(f"node stopped in {time.monotonic() - began:.2f} s:", census(victim.service.host))
        outer.cancel_scope.cancel()


if __name__ == "__main__":
    which = sys.argv[1]
    runs = {
        "zombie": lambda: zombie(True),
        "idle": lambda: zombie(False),
        "drop": drop,
        "maxconn": maxconn,
        "stall": stall,
        "shutdown": shutdown,
    }
    trio.run(runs[which])
