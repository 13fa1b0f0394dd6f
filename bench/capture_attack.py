"""The attacker's process of bench/capture.py: many libp2p hosts, each its own key and address
in the attacker's few /16s, connected to the target node, answering its discovery with Sybil
records (issue #41, "capture").

Each **attacker host** listens at its address, dials the target from it (bound there, as
bench/wild_link.py binds every dial) and keeps that link: a link the target closes (its
connection manager trims the largest groups first, and closes young links past 8 a /16) is
dialled again after 5-35 s, as a real attacker would. A /16's hosts connect in batches of
`batch` every `batch_seconds`, so that few are closed as too young. While connected it pushes
its own signed record to the target's discovery every `push_seconds` (an honest node asks its
peers as often; a refusal is counted), answers the target's discovery asks with its own record
and 15 Sybil records, and answers `/sapo/groups/1` at once with no groups (an author that
answers is never left out of the draw: its best play for its own keys).

The Sybils, by arm:
  dead     keys minted for each answer, signed by those keys, each naming 8 addresses in the
           answerer's /16 that never answer: a TCP port of one of the attacker hosts that takes
           connections into its backlog and never reads (one direct, 7 through relays that do
           not exist), as bench/fetch_stall.py's dead authors;
  holding  real hosts (`holders_per_group` in each /16, each its own key and address) that take
           a `/sapo/groups/1` request and never answer, as fetch_stall's holding authors; an
           answer names 15 of its /16's holders (a real host is a key the attacker must keep
           running, so these are a pool, not minted per answer).

    ip netns exec NS python -m bench.capture_attack PLAN.json

Writes one JSON row (kind "attack") to the plan's attack rows: the ids of its hosts and holders
and what it counted, at the plan's end.
"""

from __future__ import annotations

import json
import logging
import random
import socket
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr

from bench.wild_link import NODE, install, meter_for
from bench.wild_node import clock_at

HOLD_AT_MOST_SECONDS = 120.0


@dataclass
class Host:
    """One attacker host or holder: its key, address and signed record."""

    ip: str
    port: int
    key: Any = field(default_factory=create_new_key_pair)

    @property
    def peer_id(self) -> ID:
        return ID.from_pubkey(self.key.public_key)

    @property
    def listen(self) -> multiaddr.Multiaddr:
        return multiaddr.Multiaddr(f"/ip4/{self.ip}/tcp/{self.port}")

    def record(self) -> bytes:
        from sapo.protocol.wire.peer_records import seal_own_record

        return seal_own_record(self.key, [self.listen])


def group_of(ip: str) -> str:
    return ".".join(ip.split(".")[:2])


class Sybils:
    """The records an answer carries besides the answerer's own, by arm."""

    def __init__(self, arm: str, attack: dict, hosts: list[Host], holders: list[Host], counts: Counter):
        self.arm, self.attack, self.counts = arm, attack, counts
        self.host_ips: dict[str, list[str]] = {}
        for host in hosts:
            self.host_ips.setdefault(group_of(host.ip), []).append(host.ip)
        self.holders: dict[str, list[tuple[bytes, str]]] = {}
        for holder in holders:
            self.holders.setdefault(group_of(holder.ip), []).append((holder.record(), holder.ip))

    def answer(self, answerer: Host, count: int) -> list[tuple[bytes, str | None]]:
        group = group_of(answerer.ip)
        if self.arm == "holding":
            pool = self.holders.get(group, [])
            return random.sample(pool, min(count, len(pool)))
        if self.arm == "dead":
            return [self.dead_record(group) for _ in range(count)]
        return []

    def dead_record(self, group: str) -> tuple[bytes, str]:
        """A fresh key's record of 8 addresses at the tarpits of this /16's attacker hosts."""
        from sapo.protocol.wire.peer_records import seal_own_record

        port = self.attack["tarpit_port"]
        ips = random.choices(self.host_ips[group], k=8)
        relays = [ID.from_pubkey(create_new_key_pair().public_key).to_base58() for _ in range(7)]
        addrs = [multiaddr.Multiaddr(f"/ip4/{ips[0]}/tcp/{port}")] + [
            multiaddr.Multiaddr(f"/ip4/{ip}/tcp/{port}/p2p/{relay}/p2p-circuit") for ip, relay in zip(ips[1:], relays)
        ]
        self.counts["sybils_minted"] += 1
        return seal_own_record(create_new_key_pair(), addrs), ips[0]


async def run_attacker(me: Host, connect_s: float, plan: dict, sybils: Sybils, counts: Counter) -> None:
    """Connect to the target from `me`'s address at `connect_s` and keep connected; push our
    record, answer discovery with Sybils and group requests with nothing."""
    from sapo.protocol.toolkit import streams
    from sapo.protocol.toolkit.frames import read_frame
    from sapo.protocol.toolkit.hosts import new_noise_host, open_peers
    from sapo.protocol.wire import group_wire, peer_records

    NODE.set(meter_for(me.ip))  # this host's dials leave from its own address
    attack = plan["attack"]
    own = me.record()
    target = info_from_p2p_addr(multiaddr.Multiaddr(attack["target"]))
    host = new_noise_host(me.key, [me.listen])

    async def answer_discovery(stream: Any) -> None:
        try:
            with trio.fail_after(5):
                await read_frame(stream, peer_records.MAX_FRAME_BYTES)
                records = sybils.answer(me, peer_records.RECORDS_PER_RESPONSE)
                await stream.write(peer_records.encode_response(own, records))
                await stream.close()
            counts["discovery_answers"] += 1
            counts["sybils_sent"] += len(records)
        except Exception as error:  # noqa: BLE001 - the target reset or left; its loss
            counts[f"discovery_answer_failed_{type(error).__name__}"] += 1

    async def answer_groups(stream: Any) -> None:
        try:
            with trio.fail_after(5):
                await read_frame(stream, group_wire.MAX_REQUEST_BYTES)
                await stream.write(group_wire.encode_response([]))
                await stream.close()
            counts["group_requests_answered_empty"] += 1
        except Exception:  # noqa: BLE001
            counts["group_answer_failed"] += 1

    host.set_stream_handler(peer_records.PROTOCOL_ID, answer_discovery)
    host.set_stream_handler(group_wire.PROTOCOL_ID, answer_groups)
    async with host.run([me.listen]):
        await trio.sleep_until(clock_at(plan, connect_s))
        while True:
            counts["dials"] += 1
            try:
                with trio.fail_after(10):
                    await host.connect(target)
            except Exception:  # noqa: BLE001 - refused or timed out: try again later
                counts["dials_failed"] += 1
                await trio.sleep(random.uniform(10, 30))
                continue
            counts["connected"] += 1
            next_push = trio.current_time() + random.uniform(0, attack["push_seconds"])
            while target.peer_id in open_peers(host):
                if trio.current_time() >= next_push:
                    next_push += attack["push_seconds"] * random.uniform(0.75, 1.25)
                    try:
                        request = peer_records.encode_request(own)
                        await streams.ask(
                            host,
                            target.peer_id,
                            peer_records.PROTOCOL_ID,
                            request,
                            max_reply_bytes=peer_records.MAX_FRAME_BYTES,
                            seconds=5,
                        )
                        counts["pushes"] += 1
                    except Exception:  # noqa: BLE001 - the target's limits refused it
                        counts["pushes_refused"] += 1
                await trio.sleep(2)
            counts["links_lost"] += 1
            await trio.sleep(random.uniform(5, 35))


async def run_holder(me: Host, counts: Counter) -> None:
    """A real host that takes `/sapo/groups/1` requests and never answers them."""
    from sapo.protocol.toolkit.hosts import new_noise_host
    from sapo.protocol.wire import group_wire

    NODE.set(meter_for(me.ip))
    host = new_noise_host(me.key, [me.listen])

    async def hold(stream: Any) -> None:
        counts["group_requests_held"] += 1
        with trio.move_on_after(HOLD_AT_MOST_SECONDS):
            try:
                while await stream.read(1024):
                    pass
            except Exception:  # noqa: BLE001 - the asker's reset ends the hold
                pass

    host.set_stream_handler(group_wire.PROTOCOL_ID, hold)
    async with host.run([me.listen]):
        await trio.sleep_forever()


def tarpits(stack: ExitStack, ips: list[str], port: int) -> None:
    """A TCP port at each of `ips` that takes connections into its backlog and never reads."""
    for ip in ips:
        listener = stack.enter_context(socket.socket())
        listener.bind((ip, port))
        listener.listen(4096)


def hosts_of(attack: dict, kind: str) -> list[Host]:
    return [Host(ip, attack["port"]) for ip in attack[kind]]


async def attack(plan: dict) -> dict:
    attack = plan["attack"]
    install(0.0)  # no emulated latency; each host's dials bound to its own address
    counts: Counter = Counter()
    hosts = hosts_of(attack, "hosts")
    holders = hosts_of(attack, "holders") if attack["arm"] == "holding" else []
    sybils = Sybils(attack["arm"], attack, hosts, holders, counts)
    rng = random.Random(plan["seed"])
    row: dict = {}

    async def finish(nursery: trio.Nursery) -> None:
        await trio.sleep_until(clock_at(plan, plan["end_s"]))
        row.update(
            kind="attack", run=plan["run"], arm=attack["arm"], counts=dict(counts),
            hosts=[h.peer_id.to_base58() for h in hosts], holders=[h.peer_id.to_base58() for h in holders],
        )  # fmt: skip
        with open(attack["rows"], "w") as out:  # noqa: ASYNC230 - once, at the end: the row must outlive a hung exit
            out.write(json.dumps(row) + "\n")
        nursery.cancel_scope.cancel()

    with ExitStack() as stack:
        if attack["arm"] == "dead":
            tarpits(stack, [h.ip for h in hosts], attack["tarpit_port"])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(finish, nursery)
            for holder in holders:
                nursery.start_soon(run_holder, holder, counts)
            by_group: dict[str, int] = {}
            for host in hosts:
                k = by_group[group_of(host.ip)] = by_group.get(group_of(host.ip), -1) + 1
                connect_s = attack["start_s"] + (k // attack["batch"]) * attack["batch_seconds"] + rng.uniform(0, 3)
                nursery.start_soon(run_attacker, host, connect_s, plan, sybils, counts)
    return row


def main(argv: list[str]) -> int:
    plan = json.loads(Path(argv[0]).read_text())
    logging.basicConfig(level=logging.ERROR)
    import sapo.protocol.toolkit.hosts  # noqa: F401 - imported before the clock starts

    started = time.time()
    trio.run(attack, plan)
    print(f"attack process done after {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
