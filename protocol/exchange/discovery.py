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
`max_tracked` in a table that no source can fill (protocol/exchange/peer_table.py: caps per
source, per network group of sources and per network group of records), and dial random
unconnected ones until we have `target` peers. Dials respect the caller's `may_dial` (allow
list, bans); a record whose dials fail, ours or a fetch's (`dial_failed`), is retried with
back-off and dropped after a few failures.

Whom to believe (issue #41). Only addresses a record's owner signed are kept. A node listening
on 0.0.0.0 can only say "0.0.0.0", so a record travels with the IP its sender saw that peer
connect from (a hint, unsigned). The hint fills in 0.0.0.0 only when it is *first-hand*: the IP
our own connection to that very peer came from (`request.remote_ip` for an asker's own record,
`reply.remote_ip` for an answerer's). A third party's hint is only a dial candidate after the
record's own addresses; it never replaces one, and a same-seq replay changes nothing we hold. A
stranger cannot point us at our machine or LAN: a record's loopback addresses are kept only if
its source reached us over loopback, its private ones only if the source is not public. A
wrong address still costs only a failed dial, never an impersonation: Noise authenticates the
peer id on every connection.

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

from sapo.protocol.exchange.peer_table import PeerTable, Source
from sapo.protocol.toolkit import streams
from sapo.protocol.toolkit.hosts import address_scope, dialled_peers, open_peers, reached_group
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.protocol.toolkit.streams import Request, ServeLimits, StreamServer
from sapo.protocol.wire.peer_records import (
    MAX_FRAME_BYTES,
    PROTOCOL_ID,
    BadRecord,
    KnownPeer,
    check_record,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    seal_own_record,
)

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
        dialled: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key_pair = key_pair
        # Links we opened ourselves (the bootstrap peers aside, network.py): discovery dials until
        # `target` of them are open. Links strangers open to us do not count, or a node that
        # strangers connect to would dial nobody and know only what they tell it.
        self.dialled = dialled or (lambda: len(dialled_peers(host)))
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
        source = Source(request.peer, reached_group(request.remote_ip))
        self._learn(theirs, request.remote_ip, source, request.remote_ip, own=True)
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
            if self.dialled() >= self.target:
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
        self.learn_answer(peer, reply.remote_ip, own, peers)

    def learn_answer(self, peer: ID, remote_ip: str | None, own: bytes, peers: list[tuple[bytes, str | None]]) -> None:
        """What `peer`, whose connection came from `remote_ip`, answered: its own record
        (first-hand) and the records it passes on, each held as told us by `peer`."""
        source = Source(peer, reached_group(remote_ip))
        self._learn(own, remote_ip, source, remote_ip, own=True)
        for envelope, observed_ip in peers:
            self._learn(envelope, observed_ip, source, remote_ip, own=False)

    async def dial_some(self) -> None:
        """Dial random known, unconnected, dialable peers until we have dialled `target`."""
        connected = set(open_peers(self._host))
        need = self.target - self.dialled()
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
        if await self.dialer.dial(PeerInfo(entry.peer_id, entry.dial_addrs)):
            self.table.dial_ok(entry.peer_id)
            self.count("discovery_connected")
            logger.info("connected to discovered peer %s", entry.peer_id)
        else:
            self.table.dial_failed(entry.peer_id, self.clock())
            self.count("discovery_dial_failed")

    def dial_failed(self, peer_id: ID) -> None:
        """Someone else's dial of `peer_id` failed (a fetch's): its record backs off, as after
        ours, and after a few failures leaves the table."""
        self.table.dial_failed(peer_id, self.clock())

    def forget(self, peer_id: ID) -> None:
        self.table.remove(peer_id)

    def known(self) -> list[KnownPeer]:
        """Every record we hold: a sample of the swarm that asks and answers keep refreshing."""
        return self.table.entries()

    def drawable(self) -> list[KnownPeer]:
        """The records a fetch may draw now: those not waiting out a failed dial."""
        return self.table.candidates(self.clock(), skip=lambda peer: False)

    def addrs_of(self, peer_id: ID) -> list[multiaddr.Multiaddr]:
        """Where the record we hold for `peer_id` says to dial it, or []."""
        return list(self.table.addrs_of(peer_id))

    def _learn(
        self, envelope: bytes, observed_ip: str | None, source: Source, reached_from: str | None, *, own: bool
    ) -> None:
        """Check a record that `source`, whose connection came from `reached_from`, told us of
        (`own`: its own record, first-hand, with `observed_ip` = `reached_from`), and hold it as
        that source's."""
        try:
            entry = check_record(envelope, observed_ip, source.peer if own else None, reach=address_scope(reached_from))
        except BadRecord as error:
            self.count("records_rejected")
            logger.debug("peer record refused: %s", error)
            return
        if entry.peer_id == self._me or not self.may_dial(entry.peer_id):
            return
        if self.table.add(entry, source):
            self.count("peers_discovered")
