"""Capturing the draw (issue #41, "eclipse"): how much of a fetch's draw honest authors keep
when strangers with many connections answer discovery with nothing but Sybil records.

A node's discovery is fed as it is in a swarm, for `--minutes` of simulated time: every ~10 s
it asks one of its connections (an attacker answers with its own record and 15 records of keys
minted for that answer; an honest peer with its own and 15 of the honest swarm's, each with the
IP hint a node passes on), and each connection asks it in turn every few minutes, sending its
own record. Then the fetch's draw runs many times over what the network would hand the fetcher
(protocol/network.py `_authors`: our connections, in their connection's network group, and
the table's records, in their source's), and we count the honest authors among the first
`PICKS` drawn (a fetch of 16 groups asks 8 authors).

Real parts: the records are signed (`seal_own_record`) and checked (`check_record`) as on the
wire, learned through `PeerDiscovery`'s own `_learn`, held in the real `PeerTable`, with real
network groups (toolkit/hosts.py), and ordered by `draw_order`. What is simulated: the clock,
the connections (an IP each) and the asks. No record ever leaves for a failed dial here, as
if every Sybil answered its dials: the attackers' best case.

Before: discovery.py of main at 49a8773 (read from git), which held the 256 most recently
learned records and drew uniformly. After: this tree.

    python -m bench.draw_capture            # 30 and 100 attacker connections, an hour each
    python -m bench.draw_capture --smoke    # 100 attackers, 10 minutes

It also times a record's insert into a full table of 256 and of 4,096 records all on loopback
(one group no group cap bounds, so its buckets are the largest there are): the cost of making
way must not grow with the table.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import multiaddr
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from sapo.protocol.exchange import discovery as discovery_now
from sapo.protocol.exchange.draw import draw_order
from sapo.protocol.exchange.group_fetch import Author
from sapo.protocol.exchange.peer_table import PeerTable, Source
from sapo.protocol.toolkit.hosts import reached_group
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.protocol.wire.peer_records import RECORDS_PER_RESPONSE, check_record, seal_own_record

ROOT = Path(__file__).resolve().parent.parent
MAIN = "49a8773"  # main before issue #41's table and draw
ASK_SECONDS = 10.0  # discovery_interval_seconds, once a node has its peers
REASK_SECONDS = 300.0  # how often each connection sends us its own record again
PICKS = 8  # authors a fetch of 16 groups asks (GROUPS_PER_AUTHOR = 2)
DRAWS = 2000


@dataclass(frozen=True)
class Scenario:
    attackers: int = 100  # attacker connections...
    attacker_groups: int = 4  # ...from this many IPv4 /16s
    honest_connections: int = 6  # each in its own /16
    honest_swarm: int = 20  # honest nodes in all (the connections among them)
    minutes: float = 60.0
    forged: bool = False  # Sybil records name addresses in /16s the attacker does not hold
    max_tracked: int = 256
    seed: int = 0


@dataclass
class Peer:
    key: KeyPair
    ip: str
    honest: bool
    record: bytes = b""
    id: ID = field(init=False)

    def __post_init__(self) -> None:
        self.id = ID.from_pubkey(self.key.public_key)
        # an honest node listens on 0.0.0.0 and can say only that; the hint says where it is
        address = "/ip4/0.0.0.0/tcp/4001" if self.honest else f"/ip4/{self.ip}/tcp/4001"
        self.record = seal_own_record(self.key, [multiaddr.Multiaddr(address)])


def honest_ip(i: int) -> str:
    return f"{20 + i}.{i + 1}.0.1"  # a public /16 each


def attacker_ip(i: int, groups: int) -> str:
    return f"{150 + i % groups}.7.{i // 250}.{i % 250 + 1}"  # `groups` public /16s


def new_discovery(module: Any, max_tracked: int, clock: Any) -> Any:
    """A `PeerDiscovery` of `module` (today's, or main's), without a host: only its learning runs."""
    return module.PeerDiscovery(
        create_new_key_pair(),
        None,
        addresses=lambda: [],
        target=4,
        interval=ASK_SECONDS,
        max_tracked=max_tracked,
        gate=PeerGate(),
        dialer=None,
        clock=clock,
    )


class Node:
    """The node under attack: feeds its discovery as a stream would, today's way or main's."""

    def __init__(self, module: Any, max_tracked: int) -> None:
        self.now = 0.0
        self.today = module is discovery_now
        self.discovery = new_discovery(module, max_tracked, lambda: self.now)

    def asked_by(self, peer: Peer) -> None:
        if self.today:
            source = discovery_now.Source(peer.id, reached_group(peer.ip))
            self.discovery._learn(peer.record, peer.ip, source, peer.ip, own=True)
        else:
            self.discovery._learn(peer.record, peer.ip, expect_peer=peer.id)

    def answered(self, peer: Peer, records: list[tuple[bytes, str | None]]) -> None:
        if self.today:
            self.discovery.learn_answer(peer.id, peer.ip, peer.record, records)
        else:
            self.discovery._learn(peer.record, peer.ip, expect_peer=peer.id)
            for envelope, hint in records:
                self.discovery._learn(envelope, hint)

    def authors(self, connections: list[Peer]) -> list[Author]:
        """What the network hands the fetcher (protocol/network.py `_authors`)."""
        known = self.discovery.drawable() if self.today else self.discovery.known()
        by_id = {e.peer_id: Author(e.peer_id, (), getattr(e, "source_group", "")) for e in known}
        by_id.update({p.id: Author(p.id, (), reached_group(p.ip)) for p in connections})
        return list(by_id.values())


def sybils(attacker: Peer, scenario: Scenario, rng: random.Random) -> list[tuple[bytes, str | None]]:
    """One answer's worth of records of keys minted for it."""
    out = []
    for _ in range(RECORDS_PER_RESPONSE):
        if scenario.forged:
            ip = f"{rng.randrange(30, 120)}.{rng.randrange(256)}.{rng.randrange(256)}.1"
        else:
            ip = f"{attacker.ip.rsplit('.', 2)[0]}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        record = seal_own_record(create_new_key_pair(), [multiaddr.Multiaddr(f"/ip4/{ip}/tcp/4001")])
        out.append((record, ip))
    return out


def simulate(module: Any, scenario: Scenario) -> tuple[Node, list[Peer], set[ID]]:
    """Feed a node's discovery for `scenario.minutes`; the node, its connections, the honest ids."""
    rng = random.Random(scenario.seed)
    honest = [Peer(create_new_key_pair(), honest_ip(i), True) for i in range(scenario.honest_swarm)]
    attackers = [
        Peer(create_new_key_pair(), attacker_ip(i, scenario.attacker_groups), False) for i in range(scenario.attackers)
    ]
    connections = honest[: scenario.honest_connections] + attackers
    node = Node(module, scenario.max_tracked)
    next_reask = {p.id: rng.uniform(0, REASK_SECONDS) for p in connections}
    while node.now < scenario.minutes * 60:
        node.now += ASK_SECONDS * rng.uniform(0.75, 1.25)
        for peer in connections:
            if next_reask[peer.id] <= node.now:
                node.asked_by(peer)
                next_reask[peer.id] = node.now + REASK_SECONDS
        peer = rng.choice(connections)
        if peer.honest:
            others = [h for h in honest if h is not peer]
            node.answered(peer, [(h.record, h.ip) for h in rng.sample(others, RECORDS_PER_RESPONSE)])
        else:
            node.answered(peer, sybils(peer, scenario, rng))
    return node, connections, {p.id for p in honest}


def honest_share(authors: list[Author], honest: set[ID], by_group: bool, seed: int = 1) -> tuple[float, float]:
    """(honest share of the first PICKS drawn, of the first one), over DRAWS draws."""
    rng = random.Random(seed)
    picks = first = 0
    for _ in range(DRAWS):
        if by_group:
            order = draw_order(authors, lambda author: author.group, rng.shuffle)
        else:
            order = list(authors)
            rng.shuffle(order)
        picks += sum(a.peer_id in honest for a in order[:PICKS])
        first += order[0].peer_id in honest
    return picks / (DRAWS * PICKS), first / DRAWS


def main_module() -> Any:
    """discovery.py as it was on main at MAIN, run beside today's other modules."""
    source = subprocess.run(
        ["git", "show", f"{MAIN}:protocol/exchange/discovery.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType("discovery_at_main")
    exec(compile(source, f"{MAIN}:protocol/exchange/discovery.py", "exec"), module.__dict__)
    return module


def run(scenario: Scenario, module: Any, by_group: bool) -> dict[str, Any]:
    node, connections, honest = simulate(module, scenario)
    authors = node.authors(connections)
    share, first = honest_share(authors, honest, by_group)
    held = node.discovery.known()
    return {
        "table": len(held),
        "honest in table": sum(e.peer_id in honest for e in held),
        "authors": len(authors),
        "groups": len({a.group for a in authors}) if by_group else "-",
        f"honest of first {PICKS}": f"{share:.1%}",
        "honest first": f"{first:.1%}",
    }


def insert_cost(max_tracked: int, inserts: int = 2000) -> float:
    """Microseconds a third-party record's insert takes in a full table of `max_tracked`, every
    record on loopback (the "local" group, which no group cap bounds: the largest buckets)."""
    sources = [ID.from_pubkey(create_new_key_pair().public_key) for _ in range(max_tracked // 8 + 1)]
    records = [
        check_record(seal_own_record(create_new_key_pair(), [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/4001")]), None)
        for _ in range(max_tracked + inserts)
    ]
    table = PeerTable(max_tracked)
    for i, entry in enumerate(records[:max_tracked]):
        table.add(entry, Source(sources[i % len(sources)], "local"))
    start = time.perf_counter()
    for i, entry in enumerate(records[max_tracked:]):
        table.add(entry, Source(sources[i % len(sources)], "local"))
    return (time.perf_counter() - start) / inserts * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="100 attackers, 10 minutes, today's code only")
    parser.add_argument("--minutes", type=float, default=60.0)
    args = parser.parse_args()
    minutes = 10.0 if args.smoke else args.minutes
    cases = [(100, False)] if args.smoke else [(30, False), (100, False), (100, True)]
    try:
        before = None if args.smoke else main_module()
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"main's discovery.py ({MAIN}) is not readable from git here ({error}): today's only")
        before = None
    rows = []
    for attackers, forged in cases:
        scenario = Scenario(attackers=attackers, forged=forged, minutes=minutes)
        label = f"{attackers} attackers in 4 /16s, Sybils at {'forged' if forged else 'their own'} addresses"
        if before is not None:
            rows.append({"case": label, "code": f"main {MAIN}", **run(scenario, before, by_group=False)})
        rows.append({"case": label, "code": "today", **run(scenario, discovery_now, by_group=True)})
    print(f"{minutes:.0f} simulated minutes; 6 honest connections in 6 /16s, a swarm of 20 honest nodes")
    for row in rows:
        print("  ".join(f"{key}: {value}" for key, value in row.items()))
    sizes = [256] if args.smoke else [256, 4096]
    costs = ", ".join(f"{insert_cost(size):.1f} us with {size}" for size in sizes)
    print(f"a third-party record's insert into a full table, all of it one uncapped group: {costs}")


if __name__ == "__main__":
    main()
