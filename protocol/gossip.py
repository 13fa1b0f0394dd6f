"""Gossip transport: one py-libp2p 0.8.1 host with GossipSub on one topic, run as a trio task.

The rest of the node sees only `GossipService.publish(bytes)` and `ReceivedMessage`s arriving on
a memory channel. Everything below works around measured sharp edges of py-libp2p 0.8.1
(see protocol/README.md, "Transport"); several guards touch private internals of that exact
release, which is why pyproject pins `libp2p==0.8.1`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import multiaddr
import trio

from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.pubsub.pb import rpc_pb2

from sapo.protocol.addresses import parse_peer_address
from sapo.protocol.agents import PeerAgents
from sapo.protocol.dialing import BootstrapKeeper, OneDialPerPeer
from sapo.protocol.discovery import PeerDiscovery
from sapo.protocol.hosts import connection_addresses, direct_ip, new_noise_host, open_peers, peer_str
from sapo.protocol.settings import NetworkSettings
from sapo.protocol.peer_guard import PeerGuard
from sapo.protocol.recent import RecentByAuthor
from sapo.protocol.peer_protocols import PeerProtocols, quiet_refusals
from sapo.protocol.gossip_router import gossip_router, guarded_pubsub, nat_services
from sapo.protocol.pubsub_guards import cut_connections
from sapo.protocol.reachability import Reachability, ReachabilityService, network_group
from sapo.protocol.relay import RelayService
from sapo.protocol.relayed_links import RelayedLinks
from libp2p.tools.anyio_service import background_trio_service

logger = logging.getLogger("sapo.gossip")

# How many message ids we remember to drop replays (a rejoining peer is replayed 4-50 old ones),
# per author and in all: one author's flood pushes out only its own (protocol/recent.py). An
# author publishing at the gossip limit (50/s) fills its share in ~5 minutes; what is older than
# that reaches the intake, whose own per-author memories cover the whole age window.
SEEN_IDS = 65_536
SEEN_IDS_PER_AUTHOR = 16_384
# Bound on one publish (signing + handing the message to the per-peer queues).
PUBLISH_TIMEOUT_SECONDS = 5.0
# Bound on waiting for the pubsub service's internal tasks to start.
START_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class ReceivedMessage:
    """One message from another peer, signature already verified by libp2p."""

    sender: str  # base58 peer id of the signer (the message's `from` field)
    data: bytes
    message_id: bytes
    received_at: float  # time.time() when it reached this node
    topic: str = ""  # the topic it came on (the rollouts topic, unless the service was given others)


class GossipService:
    """A libp2p host + GossipSub on one topic; `run()` it in the daemon's nursery."""

    def __init__(
        self,
        settings: NetworkSettings,
        key_pair: KeyPair,
        incoming: trio.MemorySendChannel[ReceivedMessage],
        counters: dict[str, int] | None = None,
        extra_topics: tuple[str, ...] = (),
    ) -> None:
        self.settings = settings
        # the rollouts topic, then any others this node reads (e.g. peers' shared log-probs)
        self.topics = (settings.topic, *extra_topics)
        self.key_pair = key_pair
        self.incoming = incoming
        self.counters: dict[str, int] = counters if counters is not None else {}
        self._my_id = ID.from_pubkey(key_pair.public_key)
        self._seen: RecentByAuthor[None] = RecentByAuthor(SEEN_IDS_PER_AUTHOR, SEEN_IDS)
        self._host: Any = None
        self._pubsub: GuardedPubsub | None = None
        self._allowed: frozenset[bytes] | None = (
            frozenset(ID.from_base58(peer).to_bytes() for peer in settings.allow_peers)
            if settings.allow_peers
            else None
        )
        self.guard = PeerGuard(
            settings.peer_message_rate, settings.peer_message_burst, settings.ban_seconds
        )
        self._discovery: PeerDiscovery | None = None
        self._reachability: ReachabilityService | None = None
        self._relay: RelayService | None = None
        self.protocols: PeerProtocols | None = None  # which optional protocols each peer lacks
        self._bootstrap_ids: set[ID] = set()  # resolved `peers`: the relays a NATed node tries first
        self._agents: PeerAgents | None = None
        self._nursery: trio.Nursery | None = None
        self._dialer: OneDialPerPeer | None = None

    def is_allowed_bytes(self, peer_id: bytes) -> bool:
        return self._allowed is None or peer_id == self._my_id.to_bytes() or peer_id in self._allowed

    def refusal(self, peer_id: ID) -> str | None:
        """Why this peer may not connect, send or be dialled ('not_allowed', 'banned'), or None."""
        return self.refusal_bytes(peer_id.to_bytes())

    def refusal_bytes(self, peer_id: bytes) -> str | None:
        if peer_id == self._my_id.to_bytes():
            return None
        if not self.is_allowed_bytes(peer_id):
            return "not_allowed"
        if self.guard.is_banned(peer_id):
            return "banned"
        return None

    def admit_author(self, msg: rpc_pb2.Message) -> str | None:
        """Charge a new message to its author's bucket; why it is dropped, or None."""
        # libp2p numbers an author's publishes (8 bytes, big-endian): the gaps show how fast it
        # really publishes, however few of its messages reach us.
        seqno = int.from_bytes(msg.seqno, "big") if 0 < len(msg.seqno) <= 8 else None
        verdict = self.guard.admit(msg.from_id, seqno)
        if verdict == "rate_limited" and self.guard.is_banned(msg.from_id):
            self._on_ban(ID(msg.from_id), verdict)
        return verdict

    def penalize(self, peer_id: ID, reason: str) -> None:
        """Charge a peer for an offence named by a reject reason (see peer_guard.PENALTIES);
        past the threshold it is banned and disconnected."""
        if peer_id == self._my_id:
            return
        if self.guard.penalize(peer_id.to_bytes(), reason):
            self._on_ban(peer_id, reason)

    def penalize_sender(self, sender: str, reason: str) -> None:
        """`penalize` for the application's checks, which name the signer in base58."""
        try:
            peer_id = ID.from_base58(sender)
        except Exception:  # noqa: BLE001 - the intake only passes ids libp2p gave it
            return
        self.penalize(peer_id, reason)

    def banned_peers(self) -> list[str]:
        return sorted(peer_str(peer) for peer in self.guard.banned())

    def _on_ban(self, peer_id: ID, reason: str) -> None:
        self._count("peers_banned")
        logger.warning("banned peer %s for %.0f s: score fell below the threshold (last offence: %s)",
                       peer_id, self.settings.ban_seconds, reason)
        if self._discovery is not None:
            self._discovery.forget(peer_id)
        if self._nursery is not None:
            self._nursery.start_soon(self._disconnect, peer_id)

    async def _disconnect(self, peer_id: ID) -> None:
        host = self._host
        if host is None:
            return
        with trio.move_on_after(self.settings.close_timeout_seconds):
            await cut_connections(host, peer_id)
        logger.info("dropped the connection to banned peer %s", peer_id)

    @property
    def peer_id(self) -> str:
        return self._my_id.to_base58()

    @property
    def listen_addrs(self) -> list[str]:
        """Full multiaddrs (ending /p2p/<id>) once `run()` has started, else []."""
        if self._host is None:
            return []
        return [str(address) for address in self._host.get_addrs()]

    @property
    def reachability(self) -> str:
        """'public', 'private' or 'unknown' (reachability.py)."""
        return self._reachability.status.value if self._reachability is not None else Reachability.unknown.value

    @property
    def relayed_addrs(self) -> list[str]:
        """Our addresses through the relays we hold a slot on, ending in /p2p/<our id>."""
        if self._relay is None:
            return []
        return [f"{address}/p2p/{self.peer_id}" for address in self._relay.relayed_addrs()]

    @property
    def relaying(self) -> bool:
        """Whether this node currently serves circuits for other peers."""
        return self._relay is not None and self._relay.serving

    def advertised_addrs(self) -> list[multiaddr.Multiaddr]:
        """What our signed peer record says: behind NAT with a relay slot, only the relayed
        addresses (our own would cost every dialler a full timeout); otherwise our listen
        addresses."""
        host = self._host
        if host is None:
            return []
        relayed = self._relay.relayed_addrs() if self._relay is not None else []
        if relayed and self._reachability is not None and self._reachability.status is Reachability.private:
            return relayed
        return [*host.get_transport_addrs(), *relayed]

    def _host_addrs(self, candidates: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
        # identify's addresses: the host's (DCUtR needs our listen port there) and our relayed ones.
        relayed = self._relay.relayed_addrs() if self._relay is not None else []
        return [*candidates, *relayed]

    def _readvertise(self) -> None:
        if self._discovery is not None:
            self._discovery.advertise(self.advertised_addrs())

    def _on_reachability(self, status: Reachability) -> None:
        self._count(f"reachability_{status.value}")
        if self._relay is not None:
            self._relay.set_reachability(status)
        self._readvertise()

    def _may_use(self, peer_id: ID) -> bool:
        return self.refusal(peer_id) is None

    def connected_peers(self) -> list[str]:
        if self._host is None:
            return []
        return sorted(peer.to_base58() for peer in open_peers(self._host))

    def peer_agents(self) -> dict[str, str]:
        """What each peer's libp2p identify said it runs ("sapo/0.3.0", "py-libp2p/0.8.1", ...)."""
        return self._agents.agents() if self._agents is not None else {}

    def peer_scores(self) -> dict[str, float]:
        """The peer guard's score of each connected peer (0 = nothing held against it)."""
        if self._host is None:
            return {}
        return {peer.to_base58(): round(self.guard.score(peer.to_bytes()), 3) for peer in open_peers(self._host)}

    def network_group_of(self, peer: str) -> str | None:
        """The network address group (reachability.network_group: IPv4 /16, IPv6 /32, or one
        "local" group) of `peer`'s direct connection; None if it has none."""
        if self._host is None:
            return None
        try:
            ip = direct_ip(self._host, ID.from_base58(peer))
        except Exception:  # noqa: BLE001 - gossip only hands out ids libp2p decoded
            return None
        return network_group(ip) if ip is not None else None

    def peer_addresses(self) -> dict[str, list[str]]:
        """The transport address of each open connection, per connected peer (for the status page)."""
        return connection_addresses(self._host) if self._host is not None else {}

    async def publish(self, data: bytes, topic: str | None = None) -> bool:
        """Sign and gossip `data` on `topic` (the rollouts topic by default; we need not read a
        topic to publish on it); False (and counted) if it was dropped here."""
        if self._pubsub is None:
            self._count("publish_dropped")
            logger.warning("publish before the gossip service started: dropped")
            return False
        if len(data) > self.settings.max_message_bytes:
            self._count("publish_dropped")
            logger.warning(
                "publish of %d bytes refused: over max_message_bytes=%d",
                len(data),
                self.settings.max_message_bytes,
            )
            return False
        with trio.move_on_after(PUBLISH_TIMEOUT_SECONDS) as scope:
            try:
                await self._pubsub.publish(topic or self.settings.topic, data)
            except Exception as error:
                self._count("publish_dropped")
                logger.warning("publish failed: %s: %s", type(error).__name__, error)
                return False
        if scope.cancelled_caught:
            self._count("publish_dropped")
            logger.warning("publish timed out after %.0f s", PUBLISH_TIMEOUT_SECONDS)
            return False
        self._count("published")
        return True

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, subscribe, keep the bootstrap peers dialled; runs until cancelled."""
        settings = self.settings
        listen = multiaddr.Multiaddr(settings.listen)
        host = new_noise_host(self.key_pair, [listen], psk=settings.psk, addrs_factory=self._host_addrs)
        protocols = self.protocols = PeerProtocols(host, self._count)

        router = gossip_router(settings)
        pubsub = guarded_pubsub(host, router, self, settings)

        try:
            # quiet_refusals: a peer without an optional protocol is not an ERROR
            async with quiet_refusals(), host.run([listen]):
                try:
                    async with background_trio_service(pubsub), background_trio_service(router):
                        with trio.fail_after(START_TIMEOUT_SECONDS):
                            await pubsub.wait_until_ready()
                        for topic in self.topics:
                            pubsub.set_topic_validator(topic, self._validate_size, False)
                            with trio.fail_after(START_TIMEOUT_SECONDS):
                                await pubsub.subscribe(topic)
                        self._host, self._pubsub = host, pubsub
                        reachability, relay = nat_services(
                            host, settings, protocols, may_use=self._may_use, count=self._count,
                            on_reachability=self._on_reachability, on_addrs_changed=self._readvertise,
                            preferred_relays=lambda: sorted(self._bootstrap_ids, key=str),
                        )
                        self._reachability, self._relay = reachability, relay
                        discovery = self._discovery = PeerDiscovery(
                            self.key_pair,
                            target=settings.discover_peers,
                            interval=settings.discovery_interval_seconds,
                            max_tracked=settings.max_tracked_peers,
                            may_dial=lambda peer: self.refusal(peer) is None,
                            dial=self._dial_discovered,
                            count=self._count,
                            protocols=protocols,
                        )
                        discovery.attach(host, self.advertised_addrs())  # answer requests even with discovery off
                        self._dialer = OneDialPerPeer(host, relay)
                        links = RelayedLinks(host, relay, dial=self._dial_discovered, known_addrs=discovery.addrs_of,
                                             refused=lambda peer: self.refusal(peer) is not None, count=self._count)
                        agents = self._agents = PeerAgents(host, lambda: open_peers(host), self._may_use)
                        logger.info("gossip up: peer %s listening on %s, topic %s",
                                    self.peer_id, ", ".join(self.listen_addrs), settings.topic)
                        async with trio.open_nursery() as nursery:
                            self._nursery = nursery
                            await nursery.start(relay.run)
                            await nursery.start(links.run)  # relayed links that end are dialled again
                            relay.set_reachability(reachability.status)
                            await nursery.start(reachability.run)
                            keeper = BootstrapKeeper(host, settings, self._my_id, self.refusal, relay,
                                                     self._count, self._bootstrap_ids)
                            for address in settings.peers:
                                nursery.start_soon(keeper.keep, address)
                            if settings.discover_peers > 0:
                                await nursery.start(discovery.run)
                            await nursery.start(agents.run)
                            task_status.started()
                            await trio.sleep_forever()
                finally:
                    self._pubsub = None
                    self._nursery = None
                    self._discovery = None
                    self._reachability = None
                    self._relay = None
                    self._dialer = None
                    # Exiting host.run() alone leaves peers' TCP connections open (they do not
                    # notice for a long time); close() can hang on a crashed peer, so bound it.
                    with trio.move_on_after(settings.close_timeout_seconds) as scope:
                        scope.shield = True
                        await host.close()
                    if scope.cancelled_caught:
                        logger.warning(
                            "host close timed out after %.1f s", settings.close_timeout_seconds
                        )
        finally:
            self._host = None

    def _validate_size(self, forwarder: ID, msg: rpc_pb2.Message) -> bool:
        # Runs before a message is forwarded or delivered: an oversized one goes no further.
        if len(msg.data) > self.settings.max_message_bytes:
            self._count("oversized")
            if msg.from_id != self._my_id.to_bytes():  # signature already checked: the author pays
                self.penalize(ID(msg.from_id), "oversized")
            logger.warning("rejected %d-byte message from %s (forwarded by %s): over max_message_bytes=%d",
                           len(msg.data), peer_str(msg.from_id), forwarder, self.settings.max_message_bytes)
            return False
        return True

    def _deliver(self, msg: rpc_pb2.Message) -> None:
        if msg.from_id == self._my_id.to_bytes():
            return  # our own publish looping through push_msg
        assert self._pubsub is not None
        message_id = self._pubsub.get_message_id(msg)
        # libp2p forgets seen ids after 120 s and replays its message cache to peers that
        # rejoin; remember more, for longer, so the application sees each message once.
        if self._seen.contains(msg.from_id, message_id):
            self._count("duplicate")
            return
        now = time.time()
        self._seen.put(msg.from_id, message_id, None, stamp=now, now=now)
        self._count("received")
        received = ReceivedMessage(
            sender=peer_str(msg.from_id),
            data=bytes(msg.data),
            message_id=message_id,
            received_at=time.time(),
            topic=next((t for t in msg.topicIDs if t in self.topics), self.settings.topic),
        )
        try:
            # Never block the network on a slow consumer: drop and count instead.
            self.incoming.send_nowait(received)
        except trio.WouldBlock:
            self._count("inbox_channel_full")
            logger.debug("inbox full: dropped message %s", message_id.hex())
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._count("inbox_closed")

    async def _dial_discovered(self, info: PeerInfo) -> bool:
        if self._dialer is None or self.refusal(info.peer_id) is not None:
            return False
        error = await self._dialer.dial(info)
        if error is not None:
            logger.debug("dial of discovered peer %s failed: %s", info.peer_id, error)
        return error is None

    def _count(self, name: str, amount: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount


__all__ = ["GossipService", "NetworkSettings", "ReceivedMessage"]
