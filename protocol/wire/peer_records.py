"""Signed peer records and the `/sapo/peers/1` wire frames, checked before anything trusts them.

A record is a libp2p Envelope sealed with the peer's identity key (peer id + listen addresses).
`check_record` accepts one only if the signature holds, its signer is the record's peer id, and
its addresses have a dialable shape; an address a peer can only call "0.0.0.0" takes the IP its
server saw that peer connect from (an unsigned hint: a wrong one costs a failed dial, never an
impersonation, since Noise authenticates the peer id on every connection). Relayed addresses
keep their relay and never take the hint.

Frame: a 4-byte big-endian length, then one msgpack map (at most 64 KiB; keys not named here are
skipped, at most 16 keys in all).
    request   {"v": 1, "self": <envelope bytes>}
    response  {"v": 1, "self": <envelope bytes>, "peers": [[<envelope bytes>, <ip str or nil>], ...]}
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import msgpack
import multiaddr
from libp2p.crypto.keys import KeyPair
from libp2p.peer.envelope import consume_envelope, seal_record
from libp2p.peer.id import ID
from libp2p.peer.peer_record import PeerRecord

from sapo.protocol.toolkit.frames import FrameError, length_prefixed, unpack_map

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


class BadRecord(FrameError):
    """A peer record (or discovery frame) we refuse; the message is one bounded log line."""


@dataclass
class KnownPeer:
    peer_id: ID
    addrs: list[multiaddr.Multiaddr]  # dialable: /ip4|ip6/<ip>/tcp/<port>/p2p/<peer_id>
    seq: int
    envelope: bytes
    observed_ip: str | None
    failures: int = 0
    next_dial_at: float = 0.0


# --- records --------------------------------------------------------------------------------------


def seal_own_record(key_pair: KeyPair, listen_addrs: list[multiaddr.Multiaddr]) -> bytes:
    """This node's signed peer record (its transport addresses, without /p2p/)."""
    peer_id = ID.from_pubkey(key_pair.public_key)
    record = PeerRecord(peer_id, [_strip_p2p(a) for a in listen_addrs][:MAX_ADDRS_PER_RECORD])
    return seal_record(record, key_pair.private_key).marshal_envelope()


def check_record(envelope: bytes, observed_ip: str | None, expect_peer: ID | None = None) -> KnownPeer:
    """A signed peer record we may dial, or BadRecord. The signature must verify, the signing key
    must be the record's peer id (and `expect_peer`, when the record is a peer's own), and at
    least one address must be /ip4|ip6/<ip>/tcp/<port>[/p2p/<that id>]."""
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
    addrs: list[multiaddr.Multiaddr] = []
    for address in record.addrs[: 4 * MAX_ADDRS_PER_RECORD]:
        dialable = _dialable(address, signer, observed_ip)
        if dialable is not None and dialable not in addrs:
            addrs.append(dialable)
    if not addrs:
        raise BadRecord(f"record of {str(signer)[:16]} has no dialable /ip4|ip6/.../tcp/... or relayed address")
    return KnownPeer(signer, addrs[:MAX_ADDRS_PER_RECORD], record.seq, envelope, observed_ip)


def _dialable(address: multiaddr.Multiaddr, peer: ID, observed_ip: str | None) -> multiaddr.Multiaddr | None:
    """`address` as we would dial it, or None: /ip4|ip6/<ip>/tcp/<port>[/p2p/<peer>], or a relayed
    /ip4|ip6/<ip>/tcp/<port>/p2p/<relay>/p2p-circuit[/p2p/<peer>]."""
    text = str(address)
    if "/p2p-circuit" in text:
        head, _, tail = text.partition("/p2p-circuit")
        if tail not in ("", f"/p2p/{peer.to_base58()}") or "/p2p/" not in head:
            return None
        transport, _, relay_text = head.rpartition("/p2p/")
        try:
            relay = ID.from_base58(relay_text)
            # The hint is the IP *this peer* connected from, not its relay's: never substitute.
            relay_address = _ip_tcp(multiaddr.Multiaddr(transport), observed_ip, substitute=False)
        except Exception:  # noqa: BLE001 - a malformed address is simply not dialable
            return None
        if relay == peer or relay_address is None:
            return None
        return multiaddr.Multiaddr(f"{relay_address}/p2p/{relay.to_base58()}/p2p-circuit/p2p/{peer.to_base58()}")
    if "/p2p/" in text:
        text, _, named = text.rpartition("/p2p/")
        if named != peer.to_base58():
            return None
    try:
        direct = _ip_tcp(multiaddr.Multiaddr(text), observed_ip, substitute=True)
    except Exception:  # noqa: BLE001
        return None
    return None if direct is None else multiaddr.Multiaddr(f"{direct}/p2p/{peer.to_base58()}")


def _ip_tcp(address: multiaddr.Multiaddr, observed_ip: str | None, substitute: bool) -> multiaddr.Multiaddr | None:
    """`/ip4|ip6/<ip>/tcp/<port>` with an unspecified IP replaced by the hint (if `substitute`)."""
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
    hint = _ip_or_none(observed_ip)
    if ip.is_unspecified:
        if not substitute or hint is None or hint.version != ip.version or hint.is_unspecified:
            return None
        ip = hint
    elif ip.is_loopback and hint is not None and not hint.is_loopback:
        return None  # the peer is not on our machine: its 127.0.0.1 would be ourselves
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
