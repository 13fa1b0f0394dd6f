"""py-libp2p 0.8.1's Kademlia DHT (`libp2p.kad_dht`) as sapo's discovery layer (issue #41): what
it costs, and what one stranger can do to it, measured once on 127.0.0.1 in one trio process.

Every host is built as the node's (protocol/toolkit/hosts.py: Noise, yamux, and an AutoConnector
that never dials), so every connection counted below was opened by the DHT itself. The honest
`KadDHT`s (server mode, the library's defaults) are not run as services, so that nothing but the
calls measured here runs: each is seeded with 4 others' addresses (in its routing table and its
peerstore, as a bootstrap list would put them), which dials nobody.

1. *Cost.* One routing-table refresh of node 0 (`refresh_routing_table`: a self-lookup and one
   lookup per bucket), against `--nodes` - 1 honest servers: seconds, FIND_NODE queries, the
   bytes of their answers (protobuf payloads, before Noise and yamux) and the connections the DHT
   opened on its own; beside one `/sapo/peers/1` ask (our record out, our record and 15 in).
2. *Capture, poisoning and stall.* One stranger's host connects and opens two KAD streams, then
   answers every FIND_NODE with 20 ids of its own (the closest to the target of a pool it minted,
   which costs it nothing) and, for every honest peer, that peer's id: all with an unsigned
   address of its choosing, a tarpit on 127.0.0.1 that accepts TCP and never speaks. Node 0
   runs one self-lookup: its seconds, the dials that went to the tarpit, the stranger's share of
   node 0's routing table and of the lookup's answer, and the honest peers whose peerstore entry
   now lists the tarpit.
   Then it opens 12 KAD streams (what node 0 serves at once) and sends nothing: is an honest
   peer's FIND_NODE still answered?
3. *Memory.* The stranger sends PUT_VALUE records under keys outside any namespace (accepted
   without validation by default); what node 0 holds after. Then one store filled to the
   library's bound (50,000 records) and the event-loop time of each further insert.
4. *The subnet cap.* 200 ids told by one stranger, claiming addresses in 200 distinct public
   /24s, then 200 claiming one /24, into an empty routing table (in memory, with no host: it
   cannot dial anything).

    nice -n 5 .venv/bin/python -m bench.kad_eval             # 16 nodes, about 30 s (20 s of it a stalled lookup)
    nice -n 5 .venv/bin/python -m bench.kad_eval --smoke     # 6 nodes, a smaller flood and store, about 25 s

Written up in protocol/README.md ("Kademlia ... evaluated (issue #41)").
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import multiaddr
import trio
import varint
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.kad_dht import common as kad_common
from libp2p.kad_dht import peer_routing as kad_routing
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.kad_dht.pb.kademlia_pb2 import Message, Record
from libp2p.kad_dht.routing_table import RoutingTable
from libp2p.kad_dht.utils import sort_peer_ids_by_distance
from libp2p.kad_dht.value_store import ValueStore
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.peer.peerstore import env_to_send_in_RPC
from libp2p.utils.varint import read_varint_prefixed_bytes_limited

from bench.text_table import print_rows
from sapo.protocol.toolkit.hosts import new_noise_host, open_peers
from sapo.protocol.wire.peer_records import RECORDS_PER_RESPONSE, encode_request, encode_response, seal_own_record

LOOPBACK = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
SEEDS = 4  # addresses each honest node starts with
POOL = 2048  # ids the stranger mints once, to hand out the closest to each target
SERVED_AT_ONCE = 12  # KadDHT's inbound limiter (kad_dht.py:323)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16, help="honest DHT servers, node 0 included")
    parser.add_argument("--puts", type=int, default=32, help="the stranger's PUT_VALUE records")
    parser.add_argument("--put-kib", type=int, default=256, help="size of each value")
    parser.add_argument("--store", type=int, default=kad_common.MAX_VALUE_STORE_SIZE, help="records in the full store")
    parser.add_argument("--smoke", action="store_true", help="6 nodes, 4 puts, a store of 5,000")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.puts, args.store = 6, 4, 5000
    return args


@dataclass
class Tally:
    """Node 0's FIND_NODE answers, counted where its lookups read them."""

    answers: int = 0
    answer_bytes: int = 0
    tarpit_dials: int = 0
    rows: list[list[str]] = field(default_factory=list)


async def main_async(args: argparse.Namespace) -> Tally:
    tally = Tally()
    count_answers(tally)
    async with trio.open_nursery() as nursery:
        hosts = [await start_host(nursery) for _ in range(args.nodes)]
        dhts = [KadDHT(host, DHTMode.SERVER) for host in hosts]
        for i, dht in enumerate(dhts):
            for j in range(1, SEEDS + 1):
                other = hosts[(i + j) % len(hosts)]
                # lookups dial what the peerstore holds, not the table's PeerInfo (peer_routing.py:367, 377)
                dht.host.get_peerstore().add_addrs(other.get_id(), other.get_addrs(), 3600)
                await dht.routing_table.add_peer(PeerInfo(other.get_id(), other.get_addrs()))
        await measure_refresh(dhts[0], tally)
        tarpit = await nursery.start(run_tarpit, tally)
        stranger = await start_host(nursery)
        await measure_capture(dhts[0], stranger, tarpit, [h.get_id() for h in hosts[1:]], tally)
        await measure_puts(dhts[0], stranger, args, tally)
        await measure_silent_streams(dhts[0], stranger, hosts[1], tally)
        nursery.cancel_scope.cancel()
    await measure_full_store(args.store, tally)
    await measure_subnet_cap(tally)
    return tally


async def measure_refresh(dht: KadDHT, tally: Tally) -> None:
    host = dht.host
    before, answers, size = len(open_peers(host)), tally.answers, tally.answer_bytes
    started = time.monotonic()
    await dht.refresh_routing_table()
    seconds = time.monotonic() - started
    queries = tally.answers - answers
    request = len(find_node(host, host.get_id().to_bytes()))
    sapo = sapo_ask_bytes()
    opened = len(open_peers(host)) - before
    tally.rows += [
        ["refresh: seconds, FIND_NODE answered", f"{seconds:.2f} s, {queries}"],
        ["refresh: bytes out / in (payloads)", f"{queries * request:,} / {tally.answer_bytes - size:,}"],
        ["refresh: connections the DHT opened itself", f"{opened} (table {dht.routing_table.size()})"],
        ["one /sapo/peers/1 ask: bytes out / in", f"{sapo[0]:,} / {sapo[1]:,}"],
    ]


async def measure_capture(dht: KadDHT, stranger, tarpit: multiaddr.Multiaddr, honest: list[ID], tally: Tally) -> None:
    host = dht.host
    mine = [ID.from_pubkey(create_new_key_pair().public_key) for _ in range(POOL)]
    stranger.set_stream_handler(kad_common.PROTOCOL_ID, answer_with(stranger, mine, honest, tarpit))
    await stranger.connect(PeerInfo(host.get_id(), host.get_addrs()))
    for _ in range(2):  # the first stream adds us before our record is known; the second finds it
        stream = await stranger.new_stream(host.get_id(), [kad_common.PROTOCOL_ID])
        await write_frame(stream, find_node(stranger, stranger.get_id().to_bytes()))
        await read_varint_prefixed_bytes_limited(stream, kad_common.MAX_DHT_MESSAGE_SIZE)
        await stream.close()
    in_table = dht.routing_table.peer_in_table(stranger.get_id())
    minted = set(mine)
    size_before = dht.routing_table.size()
    started = time.monotonic()
    found = await dht.peer_routing.find_closest_peers_network(host.get_id().to_bytes())
    seconds = time.monotonic() - started
    table = dht.routing_table.get_peer_ids()
    store = host.get_peerstore()
    poisoned = sum(1 for peer in honest if tarpit in store.addrs(peer))
    tally.rows += [
        ["stranger in node 0's table after 2 inbound streams", "yes" if in_table else "no"],
        ["self-lookup with the stranger: seconds", f"{seconds:.1f} s"],
        ["  dials to the stranger's tarpit", f"{tally.tarpit_dials}"],
        ["  stranger's ids in the lookup's answer", f"{sum(p in minted for p in found)} of {len(found)}"],
        [
            "  stranger's ids in node 0's table",
            f"{sum(p in minted for p in table)} of {len(table)} (was {size_before})",
        ],
        ["  honest peers whose peerstore lists the tarpit", f"{poisoned} of {len(honest)}"],
    ]


async def measure_puts(dht: KadDHT, stranger, args: argparse.Namespace, tally: Tally) -> None:
    host = dht.host
    stream = await stranger.new_stream(host.get_id(), [kad_common.PROTOCOL_ID])
    acked = 0
    started = time.monotonic()
    for i in range(args.puts):
        message = Message()
        message.type = Message.MessageType.PUT_VALUE
        message.key = message.record.key = f"junk-{i}".encode()
        message.record.value = os.urandom(args.put_kib * 1024)
        await write_frame(stream, message.SerializeToString())
        reply = await read_varint_prefixed_bytes_limited(stream, kad_common.MAX_DHT_MESSAGE_SIZE)
        acked += bool(reply)
    seconds = time.monotonic() - started
    await stream.close()
    held = sum(len(record.value) for record, _ in dht.value_store.store.values())
    tally.rows += [
        [f"stranger's PUT_VALUE ({args.puts} x {args.put_kib} KiB, no namespace)", f"{acked} acked in {seconds:.1f} s"],
        ["  value bytes node 0 holds after (expire in 24 h)", f"{held / 2**20:.1f} MiB"],
        [
            "  bound: records x record size",
            f"{kad_common.MAX_VALUE_STORE_SIZE:,} x {kad_common.MAX_RECORD_SIZE // 2**20} MiB",
        ],
    ]


async def measure_silent_streams(dht: KadDHT, stranger, honest, tally: Tally) -> None:
    """The stranger opens as many KAD streams as node 0 serves at once and sends nothing; then an
    honest peer asks node 0 for its closest peers."""
    host = dht.host
    before = await asks_answered(honest, host)
    silent = [await stranger.new_stream(host.get_id(), [kad_common.PROTOCOL_ID]) for _ in range(SERVED_AT_ONCE)]
    await trio.sleep(0.5)  # the handlers start and wait for a first frame that never comes
    during = await asks_answered(honest, host)
    tally.rows.append(
        [
            f"honest FIND_NODEs answered: before / while a stranger holds {SERVED_AT_ONCE} silent streams",
            f"{before} / {during} of 3",
        ]
    )
    for stream in silent:
        await stream.reset()


async def asks_answered(asker, host, tries: int = 3) -> int:
    answered = 0
    for _ in range(tries):
        with trio.move_on_after(5):
            try:
                stream = await asker.new_stream(host.get_id(), [kad_common.PROTOCOL_ID])
                await write_frame(stream, find_node(asker, asker.get_id().to_bytes()))
                answered += bool(await read_varint_prefixed_bytes_limited(stream, kad_common.MAX_DHT_MESSAGE_SIZE))
                await stream.close()
            except Exception:  # noqa: BLE001 - reset: refused
                pass
    return answered


async def measure_full_store(records: int, tally: Tally) -> None:
    """A ValueStore filled to `records`; each further insert at the bound scans every record."""
    host = new_noise_host(create_new_key_pair(), [LOOPBACK])  # never started: put_record does not use it
    store = ValueStore(host, host.get_id())
    for i in range(records):
        store.put_record(f"k{i}".encode(), small_record(i))
    times = []
    for i in range(3):
        started = time.perf_counter()
        store.put_record(f"more{i}".encode(), small_record(i))
        times.append(time.perf_counter() - started)
    full = "full" if records >= kad_common.MAX_VALUE_STORE_SIZE else "not full"
    tally.rows.append(
        [f"one PUT_VALUE into a store of {records:,} ({full})", f"{1e3 * min(times):.0f} ms of event loop"]
    )


async def measure_subnet_cap(tally: Tally) -> None:
    """Claimed addresses decide the cap: a table with no host (nothing can be dialled)."""
    for label, address in (
        ("200 distinct /24s", lambda i: f"/ip4/8.{i // 250}.{i % 250}.1/tcp/4001"),
        ("one /24", lambda i: f"/ip4/8.8.8.{i + 1}/tcp/4001"),
    ):
        table = RoutingTable(ID.from_pubkey(create_new_key_pair().public_key), None)  # type: ignore[arg-type]
        admitted = 0
        for i in range(200):
            peer = ID.from_pubkey(create_new_key_pair().public_key)
            admitted += await table.add_peer(PeerInfo(peer, [multiaddr.Multiaddr(address(i))]))
        tally.rows.append([f"Sybils claiming {label}: admitted to an empty table", f"{admitted} of 200"])


# --- the parts ---------------------------------------------------------------------------------


def count_answers(tally: Tally) -> None:
    """Count every FIND_NODE answer a lookup reads (peer_routing reads them through this name)."""
    read = kad_routing.read_varint_prefixed_bytes_limited

    async def counted(reader: Any, max_length: int) -> bytes:
        data = await read(reader, max_length)
        tally.answers += 1
        tally.answer_bytes += len(data)
        return data

    kad_routing.read_varint_prefixed_bytes_limited = counted


def answer_with(host, mine: list[ID], honest: list[ID], tarpit: multiaddr.Multiaddr):
    """The stranger's FIND_NODE handler: its 20 ids closest to the target, and every honest id,
    each with the tarpit's address (unsigned, as the protocol allows)."""
    handed: set[ID] = set()

    async def handle(stream) -> None:
        try:
            while True:
                request = Message()
                request.ParseFromString(await read_varint_prefixed_bytes_limited(stream, 1 << 20))
                fresh = [peer for peer in mine if peer not in handed]
                chosen = sort_peer_ids_by_distance(request.key, fresh)[: kad_common.BUCKET_SIZE]
                handed.update(chosen)
                reply = Message()
                reply.type = Message.MessageType.FIND_NODE
                for peer in chosen + honest:
                    entry = reply.closerPeers.add()
                    entry.id = peer.to_bytes()
                    entry.connection = Message.ConnectionType.CONNECTED
                    entry.addrs.append(tarpit.to_bytes())
                reply.senderRecord = env_to_send_in_RPC(host)[0]
                await write_frame(stream, reply.SerializeToString())
        except Exception:  # noqa: BLE001 - the asker closed the stream
            await stream.close()

    return handle


async def run_tarpit(tally: Tally, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A TCP listener on 127.0.0.1 that accepts and never says a word; counts who dialled it."""

    async def hold(conn: trio.SocketStream) -> None:
        tally.tarpit_dials += 1
        async with conn:
            await trio.sleep_forever()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, hold, listeners)
        task_status.started(multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{port}"))


async def start_host(nursery):
    host = new_noise_host(create_new_key_pair(), [LOOPBACK])

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with host.run([LOOPBACK]):
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                with trio.move_on_after(2) as scope:
                    scope.shield = True
                    await host.close()

    await nursery.start(run)
    return host


def find_node(host, key: bytes) -> bytes:
    message = Message()
    message.type = Message.MessageType.FIND_NODE
    message.key = key
    message.senderRecord = env_to_send_in_RPC(host)[0]
    return message.SerializeToString()


async def write_frame(stream, payload: bytes) -> None:
    await stream.write(varint.encode(len(payload)) + payload)


def small_record(i: int) -> Record:
    record = Record()
    record.key, record.value = f"k{i}".encode(), b"v" * 32
    record.timeReceived = kad_common.format_time_rfc3339()
    return record


def sapo_ask_bytes() -> tuple[int, int]:
    """One /sapo/peers/1 exchange's payloads: our record out; the peer's and 15 records in."""
    addrs = [multiaddr.Multiaddr("/ip4/0.0.0.0/tcp/4001")]
    own = seal_own_record(create_new_key_pair(), addrs)
    records = [(seal_own_record(create_new_key_pair(), addrs), "198.51.100.7") for _ in range(RECORDS_PER_RESPONSE)]
    return len(encode_request(own)), len(encode_response(own, records))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("libp2p").setLevel(logging.CRITICAL)  # every refused dial and reset stream logs an ERROR
    tally = trio.run(main_async, args)
    print()
    print(
        f"kad_dht (py-libp2p 0.8.1) evaluated: {args.nodes} honest servers and one stranger in ONE trio process on "
        f"127.0.0.1; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print_rows([["measure", "value"], *tally.rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
