"""The scenario of test_attack5_young_links_from_many_groups.py, run in a network namespace of its
own (the test starts it with `unshare -n`, 11.0.0.0/8 on its loopback): a stranger with addresses
in GROUPS /16s keeps remaking LINKS_PER_GROUP links from each, every one before the connection
manager counts it, beside honest peers whose links have lasted; then newcomers from /16s of their
own try to join. It prints one JSON line: what the node kept and whom it let in.

Scaled down as test_attack_young_links is (the rule, not the wait): SLOTS inbound slots instead of
the library's 250, watermarks 8/10, a 3 s grace checked every 0.5 s. The stranger's links, 6 per
/16, stay under YOUNG_PER_GROUP, so the manager's crowding never closes them; at full scale the
same is about 20 /16s of 8 links, 7-8 handshakes a second (h-atk5's finding 3).

python -m tests.hardening.many_groups   # inside such a namespace only: it binds 11.x addresses
"""

from __future__ import annotations

import json
import random
from typing import Any

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr

from sapo.protocol.reach import connections
from sapo.protocol.toolkit.hosts import cut_connections, new_noise_host, open_peers
from tests.hardening.zombie_links import LOOPBACK, cut_slots, slots_held
from tests.support.gossip import start_node

SLOTS = 48
GRACE, CHECK = 3.0, 0.5
LOW, HIGH = 8, 10  # the 4 honest links are the longest-lasting half of LOW: never trimmed
GROUPS, LINKS_PER_GROUP = 10, 6  # 60 young links wanted, against 48 slots
HONEST = 4  # inbound links made before the attack, past their grace
NEWCOMERS = 8
ATTACK_SECONDS = 8.0


def from_address(host: Any, source: str) -> Any:
    """`host`, dialling from `source` (as a machine with that address would): py-libp2p's TCP
    transport binds the source only for hole punching, so its dial is pointed there."""
    for transport in host.get_network().transport_manager.get_transports():
        transport.dial = lambda maddr, transport=transport: transport.dial_with_source(maddr, (source, 0))
    return host


async def churn(target: Any, source: str, every: float, made: list[int]) -> None:
    """One key on `source`: connect, hold the link `every` s (before it is counted), drop it, again."""
    host = from_address(new_noise_host(create_new_key_pair(), [LOOPBACK]), source)
    async with host.run([LOOPBACK]):
        await trio.sleep(random.uniform(0, every))
        while True:
            try:
                with trio.fail_after(5):
                    await host.connect(target)
                made[0] += 1
            except Exception:  # noqa: BLE001 - refused or closed: again next turn
                pass
            await trio.sleep(every)
            with trio.move_on_after(1.0):  # cut, not the polite close: its links must stay young
                await cut_connections(host, target.peer_id)


async def joins(target: Any, source: str) -> bool:
    """Whether a fresh key on `source` connects to the node and is still connected a moment later."""
    host = from_address(new_noise_host(create_new_key_pair(), [LOOPBACK]), source)
    async with host.run([LOOPBACK]):
        try:
            with trio.fail_after(10):
                await host.connect(target)
            await trio.sleep(1.0)  # a refused connection is closed at once; a crowded one at the next check
            return target.peer_id in open_peers(host)
        except Exception:  # noqa: BLE001 - refused
            return False


async def main() -> dict[str, Any]:
    connections.GRACE_SECONDS, connections.CHECK_SECONDS = GRACE, CHECK
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            victim = await start_node(nursery, discover_peers=0, connections_low=LOW, connections_high=HIGH)
            host = victim.service.host
            cut_slots(host, SLOTS)
            target = info_from_p2p_addr(multiaddr.Multiaddr(victim.addr))
            honest = [await start_node(nursery, discover_peers=0) for _ in range(HONEST)]
            for i, node in enumerate(honest):  # each from a /16 of its own, as a public swarm's peers are
                await from_address(node.service.host, f"11.{120 + i}.0.1").connect(target)
            honest_ids = {node.service.peer_id for node in honest}
            await trio.sleep(GRACE + 1)
            honest_before = len(honest_ids & set(victim.service.connected_peers()))

            made = [0]
            for group in range(GROUPS):
                for link in range(LINKS_PER_GROUP):
                    source = f"11.{82 + group}.0.{link + 1}"
                    nursery.start_soon(churn, target, source, (GRACE - CHECK) * 0.8, made)
            held: list[int] = []
            for _ in range(int(ATTACK_SECONDS / 0.25)):
                await trio.sleep(0.25)
                held.append(slots_held(host))

            joined = [await joins(target, f"11.{150 + i}.0.1") for i in range(NEWCOMERS)]
            result = {
                "newcomers_in": sum(joined),
                "newcomers": NEWCOMERS,
                "honest_kept": len(honest_ids & set(victim.service.connected_peers())),
                "honest": HONEST,
                "honest_before": honest_before,
                "slots": SLOTS,
                "slots_held_most": max(held),
                "attacker_links_made": made[0],
                "links_trimmed": victim.counters.get("links_trimmed", 0),
            }
            nursery.cancel_scope.cancel()
    return result


if __name__ == "__main__":
    print(json.dumps(trio.run(main)), flush=True)
