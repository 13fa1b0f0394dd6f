"""Signed peer records and the `/sapo/peers/1` wire frames, checked before anything trusts them.

A record is a libp2p Envelope sealed with the peer's identity key (peer id + listen addresses).
`check_record` accepts one only if the signature holds, its signer is the record's peer id, and
its addresses have a dialable shape. Only what the owner signed is an address (issue #41): an
address a peer can only call "0.0.0.0" takes the IP our *own* connection to that peer came from
(first-hand: the record is the stream's peer's own), and otherwise the unsigned IP hint that came
with the record only makes a dial candidate (`KnownPeer.hinted`), which never replaces a signed or
first-hand address. A wrong hint costs a failed dial, never an impersonation (Noise authenticates
the peer id on every connection). Relayed addresses keep their relay and never take the hint.

Nor may a stranger point us at our own machine or LAN: an address on loopback is kept only if
whoever told us of it reached us over loopback, and a private one (RFC 1918, ULA, link-local,
carrier-grade NAT) only if it reached us from a non-public address (`reach`).

Frame: a 4-byte big-endian length, then one msgpack map (at most 64 KiB; keys not named here are
skipped, at most 16 keys in all).
    request   {"v": 1, "self": <envelope bytes>}
    response  {"v": 1, "self": <envelope bytes>, "peers": [[<envelope bytes>, <ip str or nil>], ...]}
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

import msgpack
import multiaddr
from libp2p.crypto.keys import KeyPair
from libp2p.peer.envelope import consume_envelope, seal_record
from libp2p.peer.id import ID
from libp2p.peer.peer_record import PeerRecord

from sapo.protocol.toolkit.frames import FrameError, length_prefixed, unpack_map
from sapo.protocol.toolkit.hosts import address_scope

# The stream protocol discovery speaks (protocol/exchange/discovery.py); frames are `v` WIRE_VERSION inside it.
PROTOCOL_ID = "/sapo/peers/1"
WIRE_VERSION = 1
RECORD_DOMAIN = "libp2p-peer-record"
# An Ed25519 record with a handful of addresses is ~200 bytes; 2 KiB leaves room, not abuse.
MAX_RECORD_BYTES = 2048
MAX_ADDRS_PER_RECORD = 8
RECORDS_PER_RESPONSE = 15
MAX_FRAME_BYTES = 64 * 1024
# Keys a later release adds to a frame are skipped (protocol/README.md, "Compatibility"); the
# frame's byte and string limits bound them, and so does this.
MAX_FRAME_KEYS = 16
# How near an address may be, by how near whoever told us of it is (`reach`): a source on
# loopback may name anything, one on a private address private and public ones, others public ones.
_NEARNESS = {"loopback": 0, "private": 1, "public": 2}


class BadRecord(FrameError):
    """A peer record (or discovery frame) we refuse; the message is one bounded log line."""


@dataclass
class KnownPeer:
    """A checked record, and what the table (protocol/exchange/peer_table.py) keeps beside it."""

    peer_id: ID
    # what we dial: addresses its owner signed (/ip4|ip6/<ip>/tcp/<port>/p2p/<id>, or relayed),
    # its 0.0.0.0 ones with the IP our own connection to it came from if the record is first-hand
    addrs: list[multiaddr.Multiaddr]
    seq: int
    envelope: bytes
    observed_ip: str | None  # first-hand: the IP its connection came from; else the hint that came with it
    failures: int = 0
    next_dial_at: float = 0.0
    hinted: list[multiaddr.Multiaddr] = field(default_factory=list)  # a third party's hint: candidates only
    listening: list[tuple[int, int]] = field(default_factory=list)  # (IP version, port) of its 0.0.0.0 / ::
    first_hand: bool = False  # its owner gave it to us itself, over its own connection
    # where the table holds it: who told us (a peer's own record is its own source), the network
    # group that source's connection came from, and the record's own (its first address's)
    source: ID | None = None
    source_group: str = ""
    group: str = ""

    @property
    def dial_addrs(self) -> list[multiaddr.Multiaddr]:
        """Signed and first-hand addresses first, then the hint's candidates."""
        return self.addrs + [a for a in self.hinted if a not in self.addrs]


# --- records --------------------------------------------------------------------------------------


def seal_own_record(key_pair: KeyPair, listen_addrs: list[multiaddr.Multiaddr]) -> bytes:
    """This node's signed peer record (its transport addresses, without /p2p/)."""
    peer_id = ID.from_pubkey(key_pair.public_key)
    record = PeerRecord(peer_id, [_strip_p2p(a) for a in listen_addrs][:MAX_ADDRS_PER_RECORD])
    return seal_record(record, key_pair.private_key).marshal_envelope()


def check_record(
    envelope: bytes, observed_ip: str | None, expect_peer: ID | None = None, *, reach: str | None = None
) -> KnownPeer:
    """A signed peer record we may dial, or BadRecord. The signature must verify, the signing key
    must be the record's peer id (and `expect_peer`, when the record is a peer's own: then it is
    first-hand and `observed_ip` is the IP its connection came from), and at least one address
    must be /ip4|ip6/<ip>/tcp/<port>[/p2p/<that id>] or relayed, or a third party's hint must
    give its 0.0.0.0 an IP. `reach` is how near whoever told us of it is (toolkit/hosts.py's
    `address_scope` of its connection's IP: "loopback", "private" or "public"); by default that
    of `observed_ip` (no limit without one), which is right only for a first-hand record."""
    if not isinstance(envelope, bytes) or not 0 < len(envelope) <= MAX_RECORD_BYTES:
        raise BadRecord(f"record is not 1..{MAX_RECORD_BYTES} bytes")
    try:
        env, record = consume_envelope(envelope, RECORD_DOMAIN)
        signer = ID.from_pubkey(env.public_key)
    except Exception as error:  # noqa: BLE001 - libp2p raises many types on garbage
        raise BadRecord(f"not a validly signed peer record ({type(error).__name__})") from None
    if record.peer_id != signer:
        raise BadRecord(f"record names {str(record.peer_id)[:16]} but is signed by {str(signer)[:16]}")
    if expect_peer is not None and signer != expect_peer:
        raise BadRecord(f"record of {str(signer)[:16]} sent as the record of {str(expect_peer)[:16]}")
    if reach is None:
        reach = address_scope(observed_ip) if _ip_or_none(observed_ip) is not None else "loopback"
    first_hand = expect_peer is not None
    addrs: list[multiaddr.Multiaddr] = []
    listening: list[tuple[int, int]] = []
    for address in record.addrs[: 4 * MAX_ADDRS_PER_RECORD]:
        dialable = _dialable(address, signer, reach)
        if isinstance(dialable, tuple):  # 0.0.0.0 or ::, which only the first-hand IP fills in place
            listening.append(dialable)
            dialable = (substitute(signer, [dialable], observed_ip, reach) or [None])[0] if first_hand else None
        if dialable is not None and dialable not in addrs:
            addrs.append(dialable)
    hinted = [] if first_hand else substitute(signer, listening, observed_ip, reach)
    if not first_hand and (_ip_or_none(observed_ip) is None or not within_reach(str(observed_ip), reach)):
        observed_ip = None  # a hint out of reach is neither used nor passed on
    if not addrs and not hinted:
        raise BadRecord(f"record of {str(signer)[:16]} has no dialable /ip4|ip6/.../tcp/... or relayed address")
    return KnownPeer(
        signer,
        addrs[:MAX_ADDRS_PER_RECORD],
        record.seq,
        envelope,
        observed_ip,
        hinted=hinted[:MAX_ADDRS_PER_RECORD],
        listening=listening[:MAX_ADDRS_PER_RECORD],
        first_hand=first_hand,
    )


def substitute(peer: ID, listening: list[tuple[int, int]], ip: str | None, reach: str) -> list[multiaddr.Multiaddr]:
    """`peer`'s unspecified listen addresses ((IP version, port) pairs) at `ip`, if `ip` is of
    that version and within `reach`."""
    hint = _ip_or_none(ip)
    if hint is None or hint.is_unspecified or hint.is_multicast or not within_reach(str(hint), reach):
        return []
    family = "ip4" if hint.version == 4 else "ip6"
    return [
        multiaddr.Multiaddr(f"/{family}/{hint}/tcp/{port}/p2p/{peer.to_base58()}")
        for version, port in listening
        if version == hint.version
    ]


def within_reach(ip: str, reach: str) -> bool:
    """Whether an address at `ip` may come from a source as near as `reach` (see `_NEARNESS`)."""
    return _NEARNESS[address_scope(ip)] >= _NEARNESS.get(reach, 2)


def _dialable(address: multiaddr.Multiaddr, peer: ID, reach: str) -> multiaddr.Multiaddr | tuple[int, int] | None:
    """`address` as we would dial it: /ip4|ip6/<ip>/tcp/<port>/p2p/<peer>, or a relayed
    /ip4|ip6/<ip>/tcp/<port>/p2p/<relay>/p2p-circuit/p2p/<peer>; (IP version, port) for an
    unspecified IP, which only an observed IP can fill; None if it is none of these, or
    nearer than `reach` allows."""
    text = str(address)
    if "/p2p-circuit" in text:
        head, _, tail = text.partition("/p2p-circuit")
        if tail not in ("", f"/p2p/{peer.to_base58()}") or "/p2p/" not in head:
            return None
        transport, _, relay_text = head.rpartition("/p2p/")
        try:
            relay = ID.from_base58(relay_text)
            # The hint is the IP *this peer* connected from, not its relay's: never substitute.
            relay_address = _ip_tcp(multiaddr.Multiaddr(transport), reach)
        except Exception:  # noqa: BLE001 - a malformed address is simply not dialable
            return None
        if relay == peer or not isinstance(relay_address, multiaddr.Multiaddr):
            return None
        return multiaddr.Multiaddr(f"{relay_address}/p2p/{relay.to_base58()}/p2p-circuit/p2p/{peer.to_base58()}")
    if "/p2p/" in text:
        text, _, named = text.rpartition("/p2p/")
        if named != peer.to_base58():
            return None
    try:
        direct = _ip_tcp(multiaddr.Multiaddr(text), reach)
    except Exception:  # noqa: BLE001
        return None
    if isinstance(direct, multiaddr.Multiaddr):
        return multiaddr.Multiaddr(f"{direct}/p2p/{peer.to_base58()}")
    return direct


def _ip_tcp(address: multiaddr.Multiaddr, reach: str) -> multiaddr.Multiaddr | tuple[int, int] | None:
    """`/ip4|ip6/<ip>/tcp/<port>`, or (IP version, port) if the IP is unspecified."""
    try:
        names = [p.name for p in address.protocols()]
        if names not in (["ip4", "tcp"], ["ip6", "tcp"]):
            return None
        ip = ipaddress.ip_address(address.value_for_protocol(names[0]))
        port = int(address.value_for_protocol("tcp"))
    except Exception:  # noqa: BLE001 - a malformed address is simply not dialable
        return None
    if not 0 < port < 65536 or ip.is_multicast or ip.is_reserved:
        return None
    if ip.is_unspecified:
        return (ip.version, port)
    if not within_reach(str(ip), reach):
        return None  # e.g. a stranger's 127.0.0.1 would be ourselves
    family = "ip4" if ip.version == 4 else "ip6"
    return multiaddr.Multiaddr(f"/{family}/{ip}/tcp/{port}")


def _ip_or_none(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _strip_p2p(address: multiaddr.Multiaddr) -> multiaddr.Multiaddr:
    """Without a trailing /p2p/<id> (a relayed address keeps its relay's)."""
    text = str(address)
    head, sep, last = text.rpartition("/p2p/")
    return multiaddr.Multiaddr(head) if sep and "/" not in last else address


# --- wire -----------------------------------------------------------------------------------------


def encode_request(own_record: bytes) -> bytes:
    return _frame({"v": WIRE_VERSION, "self": own_record})


def encode_response(own_record: bytes, peers: list[tuple[bytes, str | None]]) -> bytes:
    return _frame({"v": WIRE_VERSION, "self": own_record, "peers": [[e, ip] for e, ip in peers[:RECORDS_PER_RESPONSE]]})


def decode_request(payload: bytes) -> bytes:
    obj = _unpack(payload)
    if not {"v", "self"} <= set(obj):
        raise BadRecord("a request holds 'v' and 'self'")
    return _record_bytes(obj["self"])


def decode_response(payload: bytes) -> tuple[bytes, list[tuple[bytes, str | None]]]:
    obj = _unpack(payload)
    if not {"v", "self", "peers"} <= set(obj):
        raise BadRecord("a response holds 'v', 'self' and 'peers'")
    peers = obj["peers"]
    if not isinstance(peers, list) or len(peers) > RECORDS_PER_RESPONSE:
        raise BadRecord(f"'peers' must be a list of at most {RECORDS_PER_RESPONSE}")
    out: list[tuple[bytes, str | None]] = []
    for item in peers:
        if not (isinstance(item, list) and len(item) == 2 and (item[1] is None or isinstance(item[1], str))):
            raise BadRecord("each peer must be [record bytes, ip string or nil]")
        out.append((_record_bytes(item[0]), item[1]))
    return _record_bytes(obj["self"]), out


def _frame(obj: dict) -> bytes:
    payload = msgpack.packb(obj, use_bin_type=True)
    if len(payload) > MAX_FRAME_BYTES:
        raise BadRecord(f"frame of {len(payload)} bytes is over {MAX_FRAME_BYTES}")
    return length_prefixed(payload)


def _unpack(payload: bytes) -> dict:
    return unpack_map(
        payload,
        version=WIRE_VERSION,
        what="discovery",
        error=BadRecord,
        max_bin=MAX_RECORD_BYTES,
        max_array=RECORDS_PER_RESPONSE,
        max_keys=MAX_FRAME_KEYS,
    )


def _record_bytes(value: Any) -> bytes:
    if not isinstance(value, bytes) or not 0 < len(value) <= MAX_RECORD_BYTES:
        raise BadRecord(f"a record must be 1..{MAX_RECORD_BYTES} bytes")
    return value
