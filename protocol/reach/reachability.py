"""Reachability: can other peers dial this node? AutoNAT v1 (`/libp2p/autonat/1.0.0`), fixed.

A node asks a few connected peers to dial it back on its listen addresses. A peer that gets
through answers OK, one whose dial fails answers E_DIAL_ERROR; the node is `public` when more
of the latest verdicts say OK than not, `private` when more say the opposite. Public nodes can
serve as relays (relay.py), private ones reserve a slot on one.

The wire, the request parsing and the anti-amplification rules (dial only the requester's
observed IP, never serve a request that came over a relayed connection) are py-libp2p 0.8.1's
`AutoNATService`. Two of its parts do not work and are replaced here:

- The dial-back. 0.8.1 calls `host.connect()`, which returns at once when a connection to the
  peer exists, and one always does (the request came over it). So every node, NATed or not,
  was told it is reachable (tests/protocol/test_reachability.py shows it). We dial a fresh TCP
  connection and complete the Noise handshake against the requester's peer id, outside the
  swarm (no connection is registered, so nothing else notices), then close it.
- The address filter. A node listening on 0.0.0.0 can only say "0.0.0.0:4001", which 0.8.1
  never dials. We dial the port on the IP the request came from, which is the only IP the
  rules allow anyway.

Verdicts need at least one server: with a single bootstrap peer that one answers (0.8.1's
client wants four agreeing servers, which a small swarm never has). A stranger must not be
able to flip them, though (a node told it is public stops reserving relay slots and becomes
unreachable behind its NAT; one told it is private stops relaying and leans on the teller's
relays). So a verdict counts only from an established server: a bootstrap peer (the operator
named it), or a peer whose connection has lasted `MIN_SERVER_AGE_SECONDS`; and at most one
verdict counts per network group (toolkit/hosts.py's `network_group`: a peer's IPv4 /16 or IPv6 /32, as Bitcoin
Core buckets its peers, and one group for every address that is not globally routable), the
latest of that group's. The status is the majority of the latest `KEPT_VERDICTS` groups. Fresh
identities from one network, however many, are one voice, and only after they have stayed. The server side answers at
most `MAX_CONCURRENT_DIALBACKS` requests at once and one per peer per `MIN_ASK_INTERVAL_SECONDS`,
and not at all for peers the network refuses (allow list, bans).
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import multiaddr
import trio
from libp2p.host.autonat.autonat import AUTONAT_PROTOCOL_ID, AutoNATService, _addr_ip
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID
from libp2p.security.pnet.protector import new_protected_conn

from sapo.protocol.toolkit.hosts import connection_age, direct_peers, is_relayed, network_group
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.protocol.toolkit.streams import ServeLimits, StreamServer

logger = logging.getLogger("sapo.reachability")

# One dial-back: TCP connect + Noise. A NAT that drops the SYN makes this the whole wait.
DIALBACK_TIMEOUT_SECONDS = 5.0
MAX_DIALBACK_ADDRS = 4
MAX_CONCURRENT_DIALBACKS = 8
MAX_DIALBACKS_PER_PEER = 2
MIN_ASK_INTERVAL_SECONDS = 10.0
MAX_TRACKED_ASKERS = 1024
# A request, including the server's dial-back (which may try a few addresses).
QUERY_TIMEOUT_SECONDS = 4 * DIALBACK_TIMEOUT_SECONDS
SERVERS_PER_CHECK = 2
KEPT_VERDICTS = 4
# A server that is not a bootstrap peer is asked (and believed) only once its connection is this old:
# a burst of fresh identities cannot answer for us. Kept short because a public bootstrap learns its
# own status from the peers that dialled it, and relays only from then on (NATed peers wait for it;
# test_nat.py's swarm was ready in 72-106 s with 30 s, against its 120 s limit).
MIN_SERVER_AGE_SECONDS = 15.0
# Until the first verdict, look for a server this often (a peer is usually there within a second).
FIRST_CHECK_POLL_SECONDS = 1.0
# A server that could not answer (busy, asked too soon, no AutoNAT) is asked again after about this long.
RETRY_ASK_SECONDS = 6.0


class Reachability(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() of a member, which logs and messages show
    unknown = "unknown"
    public = "public"
    private = "private"


async def dial_back(network: Any, address: multiaddr.Multiaddr, peer_id: ID) -> bool:
    """True if a fresh connection to `address` reaches `peer_id`. The connection never enters
    the swarm; callers bound the time.

    It goes as far as the proof and no further. In Noise XX the responder's message (#2) carries
    its static key and its libp2p key's signature of it, encrypted under a key only the holder of
    that static key can derive: once it checks out (and names `peer_id`), we know who answered.
    Our own message (#3) is never sent, so the requester's swarm sees a dialler that gave up
    during the handshake, which it drops quietly (py-libp2p logs it at DEBUG). A completed
    handshake closed before the muxer is negotiated made py-libp2p log
    `ERROR libp2p.network.swarm: fail to upgrade mux for peer ...` on the requester, once per
    check: the first line of every `make run`'s logs."""
    transport = network.transport_manager.transport_for_dialing(address)
    if transport is None:
        return False
    raw = await transport.dial(address)
    try:
        conn = new_protected_conn(raw, network.psk) if network.psk is not None else raw
        _, security = await network.upgrader.security_multistream.select_transport_and_protocol(conn, True)
        try:
            secured = await security.secure_outbound(_UntilProven(conn), peer_id)
        except _Proven:
            return True
        await secured.close()  # a security transport that does not answer first: it is done anyway
        return True
    finally:
        try:
            await raw.close()
        except Exception:  # noqa: BLE001 - already closed
            pass


class _Proven(Exception):
    """The responder's handshake message checked out, and we were about to answer it."""


class _UntilProven:
    """A connection for the dialling side of a handshake that stops at our first write after
    the other side has spoken: by then the responder is authenticated (see `dial_back`)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._heard = False

    async def read(self, n: int | None = None) -> bytes:
        data = await self._conn.read(n)
        self._heard = True
        return data

    async def write(self, data: bytes) -> None:
        if self._heard:
            raise _Proven()
        await self._conn.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _DialBackAutoNAT(AutoNATService):
    """0.8.1's AutoNAT with a dial-back that really dials (see the module docstring)."""

    @staticmethod
    def _filter_by_observed_ip(addrs: list[bytes], observed_ip: str | None) -> list[bytes]:
        if observed_ip is None:
            return []
        observed = ipaddress.ip_address(observed_ip)
        dialable: list[bytes] = []
        for raw in addrs[: 4 * MAX_DIALBACK_ADDRS]:
            try:
                address = multiaddr.Multiaddr(raw)
                names = [p.name for p in address.protocols()]
                if names[:2] not in (["ip4", "tcp"], ["ip6", "tcp"]):
                    continue
                port = int(address.value_for_protocol("tcp"))
                ip = _addr_ip(address)
            except Exception:  # noqa: BLE001 - a malformed address is simply not dialled
                continue
            if ip is None or not 0 < port < 65536:
                continue
            if ip != observed_ip and not (
                ipaddress.ip_address(ip).is_unspecified and ipaddress.ip_address(ip).version == observed.version
            ):
                continue  # the rule: never dial an IP other than the one the request came from
            family = "ip4" if observed.version == 4 else "ip6"
            candidate = multiaddr.Multiaddr(f"/{family}/{observed}/tcp/{port}").to_bytes()
            if candidate not in dialable:
                dialable.append(candidate)
        return dialable[:MAX_DIALBACK_ADDRS]

    async def _try_dial(self, peer_id: ID, addrs: list[bytes]) -> bytes | None:
        network = self.host.get_network()
        for raw in addrs:
            with trio.move_on_after(DIALBACK_TIMEOUT_SECONDS):
                try:
                    if await dial_back(network, multiaddr.Multiaddr(raw), peer_id):
                        return raw
                except Exception as error:  # noqa: BLE001 - refused, reset, wrong peer
                    logger.debug("dial-back to %s at %s failed: %s", peer_id, multiaddr.Multiaddr(raw), error)
        return None


def _direct_connection(host: Any, peer: ID) -> tuple[str, float] | None:
    """(remote IP, seconds open) of the oldest open direct connection to `peer`, else None."""
    best: tuple[str, float] | None = None
    for connection in host.get_network().get_connections(peer):
        if connection.is_closed or is_relayed(connection):
            continue
        try:
            ips = [ip for ip in map(_addr_ip, connection.get_transport_addresses()) if ip is not None]
        except Exception:  # noqa: BLE001 - a connection closing under us
            continue
        if not ips:
            continue  # no IP address (another transport)
        ip = ips[0]
        age = connection_age(connection, time.time())
        if best is None or age > best[1]:
            best = (ip, age)
    return best


class ReachabilityService:
    """Serves AutoNAT dial-backs and keeps this node's own `status` current.

    `mode` "public"/"private" fixes the status (no checks; requests are still served).
    The `gate` (protocol/toolkit/peer_gate.py) says whom we serve and ask (allow list, bans; peers known to lack
    AutoNAT are never asked) and counts (`reachability_<status>` at each change);
    `on_change(status)` is called (synchronously) whenever the status changes. `bootstrap(peer)`
    says whether the operator named the peer (it is asked at once); any other peer only once
    connected `min_server_age` seconds."""

    def __init__(
        self,
        host: Any,
        *,
        mode: str,
        interval: float,
        gate: PeerGate,
        on_change: Callable[[Reachability], None],
        bootstrap: Callable[[ID], bool] = lambda peer: False,
        min_server_age: float = MIN_SERVER_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.gate = gate
        self.mode = mode
        self.interval = interval
        self.may_use = gate.may_use
        self.count = gate.count
        self.on_change = on_change
        self.clock = clock
        self.bootstrap = bootstrap
        self.min_server_age = min_server_age
        self.status = Reachability(mode) if mode != "auto" else Reachability.unknown
        self._autonat = _DialBackAutoNAT(host, serve=False)
        # network group -> (verdict, when, server): one voice per group, its latest
        self._verdicts: dict[str, tuple[bool, float, ID]] = {}
        self._next_ask: dict[ID, float] = {}
        # one request per peer per MIN_ASK_INTERVAL_SECONDS: a dial-back costs us a connection
        limits = ServeLimits(
            seconds=QUERY_TIMEOUT_SECONDS,
            total=MAX_CONCURRENT_DIALBACKS,
            per_peer=MAX_DIALBACKS_PER_PEER,
            rate=1 / MIN_ASK_INTERVAL_SECONDS,
            burst=1,
            max_tracked=MAX_TRACKED_ASKERS,
        )
        self._server = StreamServer("autonat", limits, gate, clock)

    def attach(self) -> None:
        self.host.set_stream_handler(AUTONAT_PROTOCOL_ID, self.handle)

    async def handle(self, stream: Any) -> None:
        """Serve one request, unless the peer is refused, asked too recently, or we are busy."""
        await self._server.handle(stream, self._autonat.handle_stream)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Ask peers to dial us back, now and then; runs until cancelled."""
        task_status.started()
        if self.mode != "auto":
            await trio.sleep_forever()
        while True:
            asked = await self.check_once()
            if self.status is Reachability.unknown or not asked:
                poll = FIRST_CHECK_POLL_SECONDS if self.status is Reachability.unknown else RETRY_ASK_SECONDS
                await trio.sleep(poll * random.uniform(0.75, 1.25))
            else:
                await trio.sleep(self.interval)

    async def check_once(self) -> int:
        """Ask up to SERVERS_PER_CHECK peers that are due; how many gave a verdict. A peer that
        gave one is asked again after `interval`, one that could not after a few seconds."""
        now = self.clock()
        established = self.established_servers()
        servers = [
            peer
            for peer in established
            if self.may_use(peer)
            and self._next_ask.get(peer, 0.0) <= now
            and not self.gate.lacks(peer, AUTONAT_PROTOCOL_ID)
        ]
        answered = 0
        for server in random.sample(servers, min(SERVERS_PER_CHECK, len(servers))):
            verdict = await self._ask(server)
            if verdict is None:
                self._next_ask[server] = self.clock() + RETRY_ASK_SECONDS * random.uniform(0.5, 1.5)
                continue
            answered += 1
            self._next_ask[server] = self.clock() + self.interval
            self._verdicts[established[server]] = (verdict, self.clock(), server)
        while len(self._verdicts) > KEPT_VERDICTS:
            oldest = min(self._verdicts, key=lambda peer: self._verdicts[peer][1])
            del self._verdicts[oldest]
        if len(self._next_ask) > 1024:
            self._next_ask = {p: t for p, t in self._next_ask.items() if t > now}
        self._update()
        return answered

    def established_servers(self) -> dict[ID, str]:
        """The directly connected peers whose verdict would count, with their network group:
        bootstrap peers, and others connected for at least `min_server_age`."""
        found: dict[ID, str] = {}
        for peer in direct_peers(self.host):
            connection = _direct_connection(self.host, peer)
            if connection is None:
                continue
            ip, age = connection
            if age >= self.min_server_age or self.bootstrap(peer):
                found[peer] = network_group(ip)
        return found

    async def _ask(self, server: ID) -> bool | None:
        # Our listen addresses; the server dials their ports on the IP it sees us at.
        addrs = [a.to_bytes() for a in self.host.get_transport_addrs() if "/p2p-circuit" not in str(a)][
            :MAX_DIALBACK_ADDRS
        ]
        try:
            status, _ = await self._autonat.query_server(server, addrs=addrs, timeout=QUERY_TIMEOUT_SECONDS)
        except Exception as error:  # noqa: BLE001 - no AutoNAT there, reset, timeout
            if not self.gate.refused(server, AUTONAT_PROTOCOL_ID, error):
                logger.debug("AutoNAT request to %s failed: %s", server, error)
            return None
        self.count("reachability_checks")
        if status == Message.OK:
            return True
        if status == Message.E_DIAL_ERROR:
            return False
        return None  # refused or bad request: that server could not judge

    def _update(self) -> None:
        successes = sum(1 for ok, _, _ in self._verdicts.values() if ok)
        failures = len(self._verdicts) - successes
        new = self.status
        if successes > failures:
            new = Reachability.public
        elif failures > successes:
            new = Reachability.private
        if new is not self.status:
            logger.info(
                "reachability: %s (%d of %d network groups' peers could dial us back)",
                new.value,
                successes,
                len(self._verdicts),
            )
            self.status = new
            self.count(f"reachability_{new.value}")
            self.on_change(new)
