"""Peer discovery: ask a connected peer whom it knows, dial a few of them (`/sapo/peers/1`).

Why: with bootstrap dialling alone a swarm is a star around its bootstrap node. GossipSub caps
the hub's mesh at D_high (12) and the pruned leaves keep re-grafting, get GRAFT-flood penalties
and miss most messages (17.8 % delivery at 16 nodes, docs/bench/network.md); GossipSub's peer
exchange (do_px) did not fix it in py-libp2p 0.8.1. Leaves need links to each other.

How: every node holds a libp2p *signed peer record* of itself (an Envelope sealed with its
identity key: peer id + listen addresses). Every `interval` seconds (every second while it
has fewer than `target` peers and its asks still teach it new ones) it opens one stream to a
random connected peer and sends its own record; the peer answers with its own record and up
to 15 records: 8 of peers *it is connected to* (alive a moment ago), the rest drawn from its
whole table, so that records cross between parts of a swarm that bootstrapped apart (a fetch
draws its authors from what discovery knows). We check every record (signature,
signer = the record's peer id, address shapes; see `check_record`), keep at most
`max_tracked`, and dial random unconnected ones until we have `target` peers. Dials respect
the caller's `may_dial` (allow list, bans); a peer that fails to answer is retried with
back-off and forgotten after a few failures.

A record names addresses as its peer sees them, and a node listening on 0.0.0.0 can only say
"0.0.0.0". So each record travels with the IP its server saw that peer connect from (a hint,
unsigned); an unspecified address takes the hint's IP. A wrong hint costs a failed dial, not
an impersonation: Noise authenticates the peer id on every connection.

A node behind NAT advertises its relayed addresses instead (`<relay>/p2p/<relay id>/p2p-circuit`,
protocol/reach/relay.py), and its record is sealed again (`own_record`) when it has won or lost a relay slot. A
relayed address never takes the hint, and a record that arrives over a relayed connection
travels without one: the IP seen there is the relay's. Whether the relay may be used (allow
list, bans) is the dialler's check, like the peer's own.

The records and their wire frames: protocol/wire/peer_records.py.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

import multiaddr
import trio
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from sapo.protocol.toolkit import streams
from sapo.protocol.toolkit.hosts import open_peers
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.protocol.toolkit.streams import Request, ServeLimits, StreamServer
from sapo.protocol.wire.peer_records import (
    MAX_FRAME_BYTES,
    PROTOCOL_ID,
    RECORDS_PER_RESPONSE,
    BadRecord,
    KnownPeer,
    check_record,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    seal_own_record,
)
from sapo.training.bounded import BoundedMap

logger = logging.getLogger("sapo.discovery")

# One request/response, stream open included; a peer slower than this is not worth waiting for.
STREAM_TIMEOUT_SECONDS = 5.0
# While below target and still learning, ask again after this long (a star fills in within a
# few asks); asks that teach nothing new back off from here to `interval`.
FAST_INTERVAL_SECONDS = 1.0
# A peer asking more often than this is refused: answering costs a signature check.
MIN_SERVE_INTERVAL_SECONDS = 0.5
MAX_CONCURRENT_SERVES = 8
MAX_SERVES_PER_PEER = 1
# Failed dials back off 2, 4, 8... s (at most a minute); after this many the record is dropped.
MAX_DIAL_FAILURES = 4


# --- the table of known peers ---------------------------------------------------------------------


class PeerTable:
    """At most `max_peers` checked records, newest-learned last; the oldest makes way."""

    def __init__(self, max_peers: int) -> None:
        self.max_peers = max_peers
        self._peers: BoundedMap[ID, KnownPeer] = BoundedMap(max_peers)

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, peer_id: ID) -> bool:
        return peer_id in self._peers

    def add(self, entry: KnownPeer) -> bool:
        """Store or refresh; True if the peer was not known before. An older record is ignored."""
        known = self._peers.get(entry.peer_id)
        if known is not None:
            if entry.seq >= known.seq:
                known.addrs, known.seq, known.envelope = entry.addrs, entry.seq, entry.envelope
                known.observed_ip = entry.observed_ip or known.observed_ip
            self._peers.touch(entry.peer_id)
            return False
        self._peers.put(entry.peer_id, entry)
        return True

    def remove(self, peer_id: ID) -> None:
        self._peers.pop(peer_id, None)

    def addrs_of(self, peer_id: ID) -> list[multiaddr.Multiaddr]:
        entry = self._peers.get(peer_id)
        return list(entry.addrs) if entry is not None else []

    def records_of(self, peers: list[ID]) -> list[tuple[bytes, str | None]]:
        """Records (with their observed IPs) of those `peers` we hold, at most one response's worth."""
        held = [self._peers[p] for p in peers if p in self._peers]
        chosen = random.sample(held, min(len(held), RECORDS_PER_RESPONSE))
        return [(entry.envelope, entry.observed_ip) for entry in chosen]

    def records_to_share(self, connected: list[ID]) -> list[tuple[bytes, str | None]]:
        """One response's worth: about half of it records of peers we are connected to (alive a
        moment ago), the rest drawn from the whole table. Only connected peers' records kept
        swarms that bootstrapped through different seeds apart (docs/bench/scale.md: three
        clusters at 64 nodes), and a fetcher's draw "uniform over the peers it knows" uniform
        over one cluster; a stale record costs a failed dial, and is dropped after a few."""
        linked = self.records_of(connected)[: RECORDS_PER_RESPONSE // 2 + 1]
        skip = set(connected)
        others = [e for e in self._peers.values() if e.peer_id not in skip]
        rest = random.sample(others, min(len(others), RECORDS_PER_RESPONSE - len(linked)))
        return linked + [(entry.envelope, entry.observed_ip) for entry in rest]

    def entries(self) -> list[KnownPeer]:
        return list(self._peers.values())

    def candidates(self, now: float, skip: Callable[[ID], bool]) -> list[KnownPeer]:
        return [e for e in self._peers.values() if e.next_dial_at <= now and not skip(e.peer_id)]

    def dial_failed(self, peer_id: ID, now: float) -> None:
        entry = self._peers.get(peer_id)
        if entry is None:
            return
        entry.failures += 1
        if entry.failures >= MAX_DIAL_FAILURES:
            self.remove(peer_id)
        else:
            entry.next_dial_at = now + min(60.0, 2.0**entry.failures)

    def dial_ok(self, peer_id: ID) -> None:
        entry = self._peers.get(peer_id)
        if entry is not None:
            entry.failures, entry.next_dial_at = 0, 0.0


# --- the service ----------------------------------------------------------------------------------


class Dials(Protocol):
    """What discovery needs of the network's dialer (protocol/reach/dialing.py)."""

    async def dial(self, info: PeerInfo) -> bool: ...


class PeerDiscovery:
    """Serves `/sapo/peers/1` and keeps up to `target` peers connected by dialling discovered ones.

    The network (network.py) owns the host and passes in what discovery must not decide alone:
    its `gate` (protocol/toolkit/peer_gate.py: whom we may serve, record and dial, which peers lack
    `/sapo/peers/1` and so are never asked, and the counters), its `dialer` (one bounded dial),
    and `addresses()`, what our signed record says now: a relay slot won or lost changes them,
    and our record is sealed again (a newer sequence number) before it next goes out."""

    def __init__(
        self,
        key_pair: KeyPair,
        host: Any,
        *,
        addresses: Callable[[], list[multiaddr.Multiaddr]],
        target: int,
        interval: float,
        max_tracked: int,
        gate: PeerGate,
        dialer: Dials,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key_pair = key_pair
        self.addresses = addresses
        self.target = target
        self.interval = interval
        self.max_tracked = max_tracked
        self.gate = gate
        self.may_dial = gate.may_use
        self.dialer = dialer
        self.count = gate.count
        self.clock = clock
        self.table = PeerTable(max_tracked)
        self._me = ID.from_pubkey(key_pair.public_key)
        self._host = host
        self._advertised: list[multiaddr.Multiaddr] = []  # what `_own` was sealed of
        self._own = b""
        # each peer's requests: one per MIN_SERVE_INTERVAL_SECONDS (answering costs a signature check)
        limits = ServeLimits(
            seconds=STREAM_TIMEOUT_SECONDS,
            total=MAX_CONCURRENT_SERVES,
            per_peer=MAX_SERVES_PER_PEER,
            rate=1 / MIN_SERVE_INTERVAL_SECONDS,
            burst=1,
            max_tracked=max_tracked,
        )
        self._server = StreamServer("discovery", limits, gate, clock)

    def attach(self) -> None:
        """Start answering requests."""
        self._host.set_stream_handler(PROTOCOL_ID, self.handle)

    def own_record(self) -> bytes:
        """Our signed record of the addresses we advertise now, sealed again when they changed."""
        addrs = self.addresses()
        if addrs != self._advertised or not self._own:
            self._advertised = list(addrs)
            self._own = seal_own_record(self.key_pair, self._advertised)
        return self._own

    async def handle(self, stream: Any) -> None:
        """Answer one request. Never raises: a bad or slow peer costs its own stream."""
        await self._server.answer(stream, MAX_FRAME_BYTES, self._respond)

    async def _respond(self, request: Request) -> bytes:
        theirs = decode_request(request.payload)
        self._learn(theirs, request.remote_ip, expect_peer=request.peer)
        connected = [p for p in open_peers(self._host) if p != request.peer]
        return encode_response(self.own_record(), self.table.records_to_share(connected))

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Ask and dial until cancelled."""
        task_status.started()
        await trio.sleep(random.uniform(0.1, 0.5))  # nodes started together should not ask in lock step
        fruitless = 0  # asks in a row that taught us nobody new
        while True:
            connected = list(open_peers(self._host))
            askable = [p for p in connected if not self.gate.lacks(p, PROTOCOL_ID)]
            known = len(self.table)
            if askable:
                await self.ask(random.choice(askable))
            if connected:
                await self.dial_some()
            fruitless = 0 if len(self.table) > known or not connected else fruitless + 1
            if len(open_peers(self._host)) >= self.target:
                wait = self.interval
            else:
                # Short of peers: ask again soon, but after a few empty answers back off, or a
                # swarm smaller than `target` would be asked once a second forever.
                wait = min(FAST_INTERVAL_SECONDS * 2 ** max(0, fruitless - 2), self.interval)
            await trio.sleep(wait * random.uniform(0.75, 1.25))

    async def ask(self, peer: ID) -> None:
        """One exchange with `peer`: our record out, its record and its peers' records in."""
        try:
            reply = await streams.ask(
                self._host,
                peer,
                PROTOCOL_ID,
                encode_request(self.own_record()),
                max_reply_bytes=MAX_FRAME_BYTES,
                seconds=STREAM_TIMEOUT_SECONDS,
            )
            own, peers = decode_response(reply.payload)
        except Exception as error:  # noqa: BLE001 - a peer that cannot answer is just not asked again soon
            if self.gate.refused(peer, PROTOCOL_ID, error):
                return  # a peer without discovery is not a failure; it is remembered and not asked again
            self.count("discovery_failed")
            logger.debug("asking %s for peers failed: %s: %s", peer, type(error).__name__, error)
            return
        self.count("discovery_asked")
        self._learn(own, reply.remote_ip, expect_peer=peer)
        for envelope, observed_ip in peers:
            self._learn(envelope, observed_ip)

    async def dial_some(self) -> None:
        """Dial random known, unconnected, dialable peers until `target` are connected."""
        connected = set(open_peers(self._host))
        need = self.target - len(connected)
        if need <= 0:
            return
        now = self.clock()
        pool = self.table.candidates(now, skip=lambda p: p in connected or p == self._me or not self.may_dial(p))
        chosen = random.sample(pool, min(need, len(pool)))
        if not chosen:
            return
        async with trio.open_nursery() as nursery:
            for entry in chosen:
                nursery.start_soon(self._dial_one, entry)

    async def _dial_one(self, entry: KnownPeer) -> None:
        self.count("discovery_dials")
        if await self.dialer.dial(PeerInfo(entry.peer_id, entry.addrs)):
            self.table.dial_ok(entry.peer_id)
            self.count("discovery_connected")
            logger.info("connected to discovered peer %s", entry.peer_id)
        else:
            self.table.dial_failed(entry.peer_id, self.clock())
            self.count("discovery_dial_failed")

    def forget(self, peer_id: ID) -> None:
        self.table.remove(peer_id)

    def known(self) -> list[KnownPeer]:
        """Every record we hold: a sample of the swarm that asks and answers keep refreshing."""
        return self.table.entries()

    def addrs_of(self, peer_id: ID) -> list[multiaddr.Multiaddr]:
        """The addresses in the record we hold for `peer_id`, or []."""
        return list(self.table.addrs_of(peer_id))

    def _learn(self, envelope: bytes, observed_ip: str | None, expect_peer: ID | None = None) -> None:
        try:
            entry = check_record(envelope, observed_ip, expect_peer)
        except BadRecord as error:
            self.count("records_rejected")
            logger.debug("peer record refused: %s", error)
            return
        if entry.peer_id == self._me or not self.may_dial(entry.peer_id):
            return
        if self.table.add(entry):
            self.count("peers_discovered")
