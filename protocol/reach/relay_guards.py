"""The fixes and guards py-libp2p 0.8.1's Circuit Relay v2 lacks, as subclasses whose every
override calls the original (relay.py decides when to relay, reserve and dial; this module puts
its checks and fixes where the library would relay for anyone, mix up circuits or fail).

- `GuardedRelayProtocol` answers only peers the network accepts (allow list, bans).
- Its `_handle_hop_stream` handles one request per HOP stream, as the spec has it. 0.8.1 keeps
  reading a HOP stream after a CONNECT, when that stream has become the circuit itself: once a
  circuit was cut at a limit, what its peer sent last was parsed as HOP messages, and a stray
  "RESERVE" among them renewed the peer's reservation with a reply that never arrived. The
  peer's voucher was then stale, and the relay refused its every later CONNECT as "Invalid
  reservation" (tests/hardening/test_relay_limits.py found it).
- Its `_relay_data` closes only its own circuit: 0.8.1 keys open circuits by peer id, so when
  one of a peer's circuits ended it closed the streams of another circuit of the same peer (a
  node behind NAT has several; test_relay.py shows it).
- It counts the circuits it cuts at its limits (`relay_circuits_limited`): a relay's limits are
  what end most circuits, and the two ends then dial again (relayed_links.py).
- Its `handle_incoming_connection` names the real relay in the address of a circuit we accept:
  0.8.1 names this node itself (`/p2p/<us>/p2p-circuit/p2p/<source>`), so nobody could tell
  which relay carried it.
- It keeps the whole relay within one `RelayBudget`, whatever the number of reservations: at most
  so many circuits open at once (past it a CONNECT is refused, `relay_refused_circuits`), relayed
  bytes slowed to a rate (the CPU share: relaying runs in Python on the cores that train) and, over
  an hour, capped (once spent, a CONNECT is refused, `relay_refused_bytes`, and open circuits are
  cut at their next read, `relay_circuits_limited`), all with RESOURCE_LIMIT_EXCEEDED. 0.8.1's
  limits are per reservation only: 64 slots x 16 circuits x 256 MiB, with no cap on the sum.
- `ProtectedCircuits` protects the dialling end of a circuit with the swarm key (pnet); 0.8.1
  protects only the accepting end, so no circuit completed its handshake in a private swarm.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import multiaddr
import trio
from libp2p.connection_types import ConnectionType
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.protocol import STREAM_READ_TIMEOUT, CircuitV2Protocol, _is_relayed_stream
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.relay.circuit_v2.utils import maybe_consume_signed_record, read_delimited_msg
from libp2p.security.pnet.protector import new_protected_conn

from sapo.protocol.settings import RELAY_BYTES_PER_HOUR, RELAY_BYTES_PER_SECOND, RELAY_MAX_CIRCUITS
from sapo.protocol.toolkit.buckets import UNBOUNDED_DEBT, TokenBucket
from sapo.protocol.toolkit.peer_gate import PeerGate

logger = logging.getLogger("sapo.relay")

# What 0.8.1's `_relay_data` says to the side that went over a limit, just before it resets the circuit.
LIMIT_MESSAGES = ("Data transfer limit exceeded", "Circuit duration limit exceeded")
# A new circuit is opened only while the hour's budget has this much left: less would be cut at once.
MIN_CIRCUIT_BYTES = 64 * 1024


class RelayBudget:
    """What the relay lends all peers together: open circuits, and relayed bytes as two token
    buckets (a rate, which bounds the CPU it takes, and an hour's worth, which bounds the uplink).
    Pure bookkeeping, no I/O; the relay protocol acts on the verdicts."""

    def __init__(
        self,
        *,
        max_circuits: int = RELAY_MAX_CIRCUITS,
        bytes_per_second: int = RELAY_BYTES_PER_SECOND,
        bytes_per_hour: int = RELAY_BYTES_PER_HOUR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_circuits = max_circuits
        self.bytes_per_second = float(bytes_per_second)
        self.bytes_per_hour = float(bytes_per_hour)
        self.clock = clock
        self.circuits = 0
        # Both buckets start full; the rate bucket holds one second, so a burst is one second's
        # bytes, and it runs into any debt: later bytes wait it out.
        now = clock()
        self._rate = TokenBucket(self.bytes_per_second, self.bytes_per_second, now, floor=UNBOUNDED_DEBT)
        self._hour = TokenBucket(self.bytes_per_hour / 3600, self.bytes_per_hour, now)

    def open_circuit(self) -> str | None:
        """Take a circuit slot; None, or why not ('relay_refused_circuits', 'relay_refused_bytes')."""
        now = self.clock()
        self._rate.refill(now)
        left = self._hour.refill(now)
        if self.circuits >= self.max_circuits:
            return "relay_refused_circuits"
        if left < min(MIN_CIRCUIT_BYTES, self.bytes_per_hour):
            return "relay_refused_bytes"
        self.circuits += 1
        return None

    def close_circuit(self) -> None:
        self.circuits = max(0, self.circuits - 1)

    def spend(self, size: int) -> float | None:
        """Pay for `size` relayed bytes: how long to wait before passing them on (the rate
        bucket may go into debt, which later bytes wait out), or None when the hour's bytes are
        spent (cut the circuit)."""
        now = self.clock()
        self._rate.refill(now)
        if self._hour.take_short(now, size):
            return None
        self._rate.charge(size)
        return self._rate.debt_seconds()


class GuardedRelayProtocol(CircuitV2Protocol):
    """0.8.1's relay protocol, answering only peers the network accepts, within one budget."""

    def __init__(self, *args: Any, gate: PeerGate, budget: RelayBudget | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._may_use = gate.may_use
        self._count = gate.count
        self.budget = budget or RelayBudget()

    async def _handle_hop_stream(self, stream: Any) -> None:
        peer = stream.muxed_conn.peer_id
        if not self.allow_hop or not self._may_use(peer):
            self._count("relay_refused")
            await self._send_status(stream, StatusCode.PERMISSION_DENIED, "not relaying for this peer")
            await self._close_stream(stream)
            return
        if _is_relayed_stream(stream):
            await super()._handle_hop_stream(stream)  # which refuses it
            return
        try:
            with trio.fail_after(STREAM_READ_TIMEOUT):
                request = await read_delimited_msg(stream, HopMessage)
        except Exception as error:  # noqa: BLE001 - a peer that went away, or garbage
            logger.debug("bad HOP request from %s: %s", peer, error)
            await stream.reset()
            return
        if request.HasField("senderRecord") and not maybe_consume_signed_record(request, self.host, peer):
            await stream.reset()
            return
        if request.type == HopMessage.RESERVE:
            await self._handle_reserve(stream, request)
            await self._close_stream(stream)
        elif request.type == HopMessage.CONNECT:
            await self._handle_connect(stream, request)  # the stream carries the circuit until it ends
        else:
            await self._send_status(stream, StatusCode.MALFORMED_MESSAGE, f"unexpected HOP message type {request.type}")
            await self._close_stream(stream)

    async def _handle_reserve(self, stream: Any, msg: Any) -> None:
        self._count("relay_reservations_served")
        await super()._handle_reserve(stream, msg)

    async def _handle_connect(self, stream: Any, msg: Any) -> None:
        try:
            target = ID(msg.peer.id)
        except Exception:  # noqa: BLE001 - a garbage id is the base class's problem
            target = None
        if target is not None and not self._may_use(target):
            self._count("relay_refused")
            await self._send_status(stream, StatusCode.PERMISSION_DENIED, "not relaying to this peer")
            await stream.reset()
            return
        refusal = self.budget.open_circuit()
        if refusal is not None:
            self._count(refusal)
            await self._send_status(
                stream,
                StatusCode.RESOURCE_LIMIT_EXCEEDED,
                "relay busy: too many circuits"
                if refusal == "relay_refused_circuits"
                else "relay busy: its relayed bytes are spent for now",
            )
            await stream.reset()
            return
        self._count("relay_circuits_served")
        try:
            await super()._handle_connect(stream, msg)
        finally:
            self.budget.close_circuit()

    async def _read_stream_with_retry(self, stream: Any, *args: Any, **kwargs: Any) -> bytes | None:
        # 0.8.1's `_relay_data` reads each direction of a circuit only through here: every relayed
        # byte is paid for before it is written on.
        data = await super()._read_stream_with_retry(stream, *args, **kwargs)
        if not data:
            return data
        wait = self.budget.spend(len(data))
        if wait is None:  # the hour's bytes are spent: end this circuit as at its own limit
            await self._send_status(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED, LIMIT_MESSAGES[0])
            return None
        if wait > 0:
            self._count("relay_throttled")
            await trio.sleep(wait)
        return data

    async def handle_incoming_connection(self, stream: Any, remote_peer_id: bytes) -> None:
        relay = stream.muxed_conn.peer_id
        try:
            source = ID(remote_peer_id)
        except Exception:  # noqa: BLE001
            source = None
        if source is None or not self._may_use(source) or not self._may_use(relay):
            self._count("relay_refused")
            await stream.reset()
            return
        await super().handle_incoming_connection(stream, remote_peer_id)
        # 0.8.1 names this node as the relay in the circuit's address; name the one that carried it.
        ours = multiaddr.Multiaddr(f"/p2p/{self.host.get_id()}/p2p-circuit/p2p/{source}")
        real = multiaddr.Multiaddr(f"/p2p/{relay}/p2p-circuit/p2p/{source}")
        for connection in self.host.get_network().get_connections(source):
            try:
                if ours in connection.get_transport_addresses():
                    # py-libp2p 0.8.1's SwarmConn has it; its INetConn interface does not declare it
                    connection.set_transport_info([real], ConnectionType.RELAYED)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - a connection closing under us
                continue

    async def _send_status(self, stream: Any, code: Any, message: str, limit: Any = None) -> None:
        if code == StatusCode.RESOURCE_LIMIT_EXCEEDED and message in LIMIT_MESSAGES:
            self._count("relay_circuits_limited")  # `_relay_data` is cutting a circuit at a limit
        await super()._send_status(stream, code, message, limit)

    async def _relay_data(
        self,
        src_stream: Any,
        dst_stream: Any,
        peer_id: ID,
        deadline: float | None = None,
        circuit_data_limit: list[int] | None = None,
    ) -> None:
        # The base class closes "the circuit of `peer_id`" when a direction ends, found by peer
        # id: with two circuits of one peer that is the other one's streams. Hand it a key it
        # holds nothing under, and close exactly this circuit's two streams instead.
        try:
            await super()._relay_data(src_stream, dst_stream, _NO_CIRCUIT, deadline, circuit_data_limit)
        finally:
            await self._close_stream(src_stream)
            await self._close_stream(dst_stream)


class ProtectedCircuits(CircuitV2Transport):
    """0.8.1's circuit transport, protecting the dialled end of a circuit with the swarm key.

    In a private swarm (pnet) 0.8.1 wraps the *accepted* end of a relayed connection in the
    key's stream cipher (`upgrade_inbound_raw_conn`) but not the dialled end
    (`upgrade_outbound_raw_conn` leaves that to the TCP dial, which a circuit does not make), so
    no circuit ever completed its handshake there (test_relay.py)."""

    async def dial(self, maddr: multiaddr.Multiaddr) -> Any:
        relay_address, target = self.parse_circuit_ma(maddr)
        relay = ID.from_base58(relay_address.get_peer_id())
        raw = await self.dial_peer_info(
            dest_info=PeerInfo(target, [maddr]), relay_info=PeerInfo(relay, [relay_address])
        )
        psk = self.host.get_network().psk  # type: ignore[attr-defined]  # the Swarm's; INetworkService lacks it
        if psk is not None:
            raw = new_protected_conn(raw, psk)
        return await self.host.upgrade_outbound_connection(raw, target)


# A peer id no circuit is ever stored under (see _relay_data).
_NO_CIRCUIT = ID(b"\x00\x24sapo-relay-no-circuit-key-000000000000")
