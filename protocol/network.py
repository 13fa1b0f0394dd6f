"""The node's network as one value: `async with open_network(settings, key_pair, incoming) as net`.

`open_network` builds, in this order, the py-libp2p 0.8.1 host, its GossipSub pubsub with the
guards 0.8.1 lacks (protocol/exchange/pubsub_guards.py), the NAT services (reachability, relay),
discovery and the keeper of relayed links, runs them in a nursery it owns, and yields a ready
`Network`: what the exchange uses (share, want, refused_fetched, publish, refusal, penalize,
network group), and one `status()` for the page. When the block ends the nursery is cancelled
and the host closed. Nothing of a `Network` is missing while it is up: no half-built state.

Every workaround below is for a measured sharp edge of py-libp2p 0.8.1 (protocol/README.md,
"Transport"), which is why pyproject pins `libp2p==0.8.1`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import multiaddr
import trio
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

from sapo.protocol.exchange.arrivals import Arrival, ArrivalSink
from sapo.protocol.exchange.discovery import PeerDiscovery
from sapo.protocol.exchange.gossip import Delivery, size_validator
from sapo.protocol.exchange.gossip_router import gossip_router, guarded_pubsub, nat_services
from sapo.protocol.exchange.group_fetch import Author, GroupFetcher, GroupServer
from sapo.protocol.exchange.older_releases import OlderReleases
from sapo.protocol.exchange.pubsub_guards import cut_off_banned, queue_ban
from sapo.protocol.peers.peer_policy import PeerPolicy
from sapo.protocol.peers.peer_protocols import PeerProtocols, quiet_refusals
from sapo.protocol.reach.connections import ConnectionManager, dialled_beside, has_joined, must_stay
from sapo.protocol.reach.dialing import BootstrapKeeper, Dialer
from sapo.protocol.reach.pubsub_streams import PubsubStreams
from sapo.protocol.reach.reachability import Reachability, ReachabilityService
from sapo.protocol.reach.relay import RelayService, Reservations
from sapo.protocol.reach.relayed_links import RelayedLinks
from sapo.protocol.settings import NetworkSettings
from sapo.protocol.toolkit.agents import PeerAgents
from sapo.protocol.toolkit.hosts import (
    connection_addresses,
    direct_ip,
    new_noise_host,
    open_peers,
    peer_place,
    reached_group,
    speaks,
)
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.protocol.wire.group_wire import PROTOCOL_ID as GROUPS_PROTOCOL_ID
from sapo.protocol.wire.group_wire import Outbox

logger = logging.getLogger("sapo.gossip")

# Bound on one publish (signing + handing the message to the per-peer queues).
PUBLISH_TIMEOUT_SECONDS = 5.0
# Bound on waiting for the pubsub service's internal tasks to start.
START_TIMEOUT_SECONDS = 10.0
# Bans waiting for their peer to be cut off; bans come one per misbehaving identity, and the
# queue is drained at once, so this is never reached short of a flood of fresh identities.
PENDING_BANS = 1024


def counter(counters: dict[str, int]) -> Callable[..., None]:
    """`count(name, amount=1)` into `counters`."""

    def count(name: str, amount: int = 1) -> None:
        counters[name] = counters.get(name, 0) + amount

    return count


@dataclass(frozen=True)
class NetworkStatus:
    """What the page (and a bench) reads of a running network, at one moment."""

    reachability: str  # 'public', 'private' or 'unknown' (protocol/reach/reachability.py)
    relaying: bool  # whether we serve circuits for other peers now
    relayed_addrs: list[str]  # ours through the relays we hold a slot on, ending in /p2p/<our id>
    advertised_addrs: list[str]  # what our signed peer record says (only the relayed ones behind NAT)
    connected: list[str]  # peers with an open connection
    addresses: dict[str, list[str]]  # the transport address of each open connection, per peer
    agents: dict[str, str]  # what each peer's identify said it runs ("sapo/0.4.0", "py-libp2p/0.8.1")
    scores: dict[str, float]  # the peer guard's score of each connected peer (0: nothing held against it)
    bans: list[str]
    counters: dict[str, int]


@dataclass(frozen=True, eq=False)
class Network:
    """A running node's network; only `open_network` makes one, whole, and nothing of it changes
    while the `async with` block runs. The services are public for tests and benches to look at."""

    settings: NetworkSettings
    topics: tuple[str, ...]  # the rollouts topic, then any others this node reads
    my_id: ID
    host: Any
    pubsub: Pubsub
    policy: PeerPolicy  # the allow list, the peer score and its bans
    gate: PeerGate  # the one answer every service gets about a peer
    nat: ReachabilityService  # our reachability (public, private, unknown), and the dial-backs we serve
    relay: RelayService
    discovery: PeerDiscovery
    dialer: Dialer
    agents: PeerAgents  # what each peer's identify says it runs
    keeper: BootstrapKeeper  # keeps each `peers` entry dialled, until the node has joined
    links: ConnectionManager  # keeps our links between the watermarks
    outbox: Outbox  # our own recent groups, served over /sapo/groups/1
    fetcher: GroupFetcher  # brings the groups `want` asks for
    older: OlderReleases  # the older releases our groups go on the topic for
    counters: dict[str, int]

    # --- who we are, and what the page shows --------------------------------------------------

    @property
    def peer_id(self) -> str:
        return self.my_id.to_base58()

    @property
    def listen_addrs(self) -> list[str]:
        """Full multiaddrs, ending /p2p/<id>."""
        return [str(address) for address in self.host.get_addrs()]

    def status(self) -> NetworkStatus:
        connected = open_peers(self.host)
        guard = self.policy.guard
        return NetworkStatus(
            reachability=self.nat.status.value,
            relaying=self.relay.serving,
            relayed_addrs=[f"{address}/p2p/{self.peer_id}" for address in self.relay.relayed_addrs()],
            advertised_addrs=[str(a) for a in advertised_addrs(self.host, self.relay, self.nat)],
            connected=sorted(peer.to_base58() for peer in connected),
            addresses=connection_addresses(self.host),
            agents=self.agents.agents(),
            scores={peer.to_base58(): round(guard.score(peer.to_bytes()), 3) for peer in connected},
            bans=self.policy.banned_peers(),
            counters=dict(self.counters),
        )

    # --- groups ------------------------------------------------------------------------------

    async def share(self, frame: bytes, round_index: int) -> bool:
        """Offer one of our group frames: peers fetch it from the outbox (protocol/exchange/group_fetch.py). It is
        also gossiped on the rollouts topic with `exchange="gossip"`, or while a connected peer
        is an older release that only reads the topic (`legacy_peers`). False if dropped here."""
        if len(frame) > self.settings.max_message_bytes:
            return await self.publish(frame)  # refused and counted there, one way for both
        self.outbox.put(round_index, frame)
        self.gate.count("shared")
        if self.settings.exchange == "gossip" or self.legacy_peers():
            return await self.publish(frame)
        return True

    def want(self, count: int) -> None:
        """Fetch about `count` groups from authors drawn uniformly across the peers we know; they
        arrive on `incoming` by the fetch route. Nothing with `exchange="gossip"`: the topic brings all."""
        if self.settings.exchange == "fetch":
            self.fetcher.want(count)

    def refused_fetched(self, count: int) -> None:
        """The node refused `count` fetched groups: the fetcher owes them again (within its retries)."""
        self.fetcher.refused_fetched(count)

    def legacy_peers(self) -> list[str]:
        """The older releases (before 0.4.0: they read the rollouts topic and cannot fetch) our
        groups go on the topic for: connected a while, and authors of groups we accepted
        (protocol/exchange/older_releases.py)."""
        return sorted(peer.to_base58() for peer in self.older.readers())

    def accepted(self, arrival: Arrival) -> None:
        """The node's intake accepted `arrival`'s group (the exchange says so): a group an older
        release signed and put on the rollouts topic makes it one our groups go to."""
        if arrival.route == "gossip" and arrival.topic == self.settings.topic:
            self.older.heard(arrival.sender)

    # --- gossip ------------------------------------------------------------------------------

    async def publish(self, data: bytes, topic: str | None = None) -> bool:
        """Sign and gossip `data` on `topic` (the rollouts topic by default; we need not read a
        topic to publish on it); False (and counted) if it was dropped here."""
        if len(data) > self.settings.max_message_bytes:
            self.gate.count("publish_dropped")
            logger.warning(
                "publish of %d bytes refused: over max_message_bytes=%d", len(data), self.settings.max_message_bytes
            )
            return False
        with trio.move_on_after(PUBLISH_TIMEOUT_SECONDS) as scope:
            try:
                await self.pubsub.publish(topic or self.settings.topic, data)
            except Exception as error:
                self.gate.count("publish_dropped")
                logger.warning("publish failed: %s: %s", type(error).__name__, error)
                return False
        if scope.cancelled_caught:
            self.gate.count("publish_dropped")
            logger.warning("publish timed out after %.0f s", PUBLISH_TIMEOUT_SECONDS)
            return False
        self.gate.count("published")
        return True

    # --- peers -------------------------------------------------------------------------------

    def refusal_bytes(self, peer_id: bytes) -> str | None:
        """Why this peer (its raw id) may not connect, send or be dialled ('not_allowed', 'banned'), or None."""
        return self.policy.refusal_bytes(peer_id)

    def penalize_sender(self, sender: str, reason: str) -> None:
        """Charge the signer (base58) of what the intake refused (peer_guard.PENALTIES); past the
        threshold it is banned and disconnected."""
        self.policy.penalize_sender(sender, reason)

    def connected_peers(self) -> list[str]:
        return sorted(peer.to_base58() for peer in open_peers(self.host))

    def network_group_of(self, peer: str) -> str | None:
        """Where `peer`'s connection comes from (toolkit/hosts.py's `peer_place`: its IP's network
        group, or its relay's for a relayed peer); None if not known."""
        return peer_place(self.host, peer)

    def by_right(self, peer: str) -> Literal["gossip", "older"] | None:
        """Why `peer`'s own groups come to us on the rollouts topic by right: "gossip", anyone's
        with exchange="gossip"; "older", an older release's in fetch mode, which cannot serve them
        (older_releases.py); None: they do not (in fetch mode a group is asked for)."""
        if self.settings.exchange == "gossip":
            return "gossip"
        try:
            return "older" if self.older.is_older(ID.from_base58(peer)) else None
        except Exception:  # noqa: BLE001 - gossip only hands out ids libp2p decoded
            return None


def advertised_addrs(host: Any, relay: RelayService, nat: ReachabilityService) -> list[multiaddr.Multiaddr]:
    relayed = relay.relayed_addrs()
    if relayed and nat.status is Reachability.private:
        return relayed
    return [*host.get_transport_addrs(), *relayed]


@asynccontextmanager
async def open_network(
    settings: NetworkSettings,
    key_pair: KeyPair,
    incoming: ArrivalSink,
    *,
    counters: dict[str, int] | None = None,
    extra_topics: tuple[str, ...] = (),
) -> AsyncIterator[Network]:
    """Listen, subscribe to the rollouts topic (and `extra_topics`), keep the bootstrap peers
    dialled; yield the running network. What other peers send goes to `incoming`, gossip's messages
    and fetched groups alike (protocol/exchange/arrivals.py), never blocking: a full channel drops
    and counts `inbox_channel_full`. Counts go to `counters`."""
    counters = counters if counters is not None else {}
    count = counter(counters)
    my_id = ID.from_pubkey(key_pair.public_key)
    topics = (settings.topic, *extra_topics)
    listen = multiaddr.Multiaddr(settings.listen)
    bans_in, bans_out = trio.open_memory_channel[ID](PENDING_BANS)
    policy = PeerPolicy(settings, my_id, count, on_ban=partial(queue_ban, bans_in))
    # identify's addresses are the host's (DCUtR needs our listen port there) and our relayed
    # ones: the relay slots are held before the relay service that keeps them, which needs the host
    reservations = Reservations()
    host = new_noise_host(key_pair, [listen], psk=settings.psk, addrs_factory=reservations.with_relayed)
    protocols = PeerProtocols(host, count)
    gate = PeerGate(
        refusal=policy.refusal, penalize=policy.penalize, count=count, lacks=protocols.lacks, refused=protocols.refused
    )
    older = OlderReleases(host, gate, PROTOCOL_ID_V11)
    router = gossip_router(settings, readers=older.readers if settings.exchange == "fetch" else None)
    delivery = Delivery(my_id, topics, incoming, count)
    pubsub = guarded_pubsub(host, router, settings, gate, policy, delivery, older.is_older)

    # quiet_refusals: a peer without an optional protocol is not an ERROR
    async with quiet_refusals(), host.run([listen]):
        try:
            async with background_trio_service(pubsub), background_trio_service(router):
                validate = size_validator(settings.max_message_bytes, my_id, gate)
                await _subscribe(pubsub, {topic: validate for topic in topics})
                network = _services(
                    settings, key_pair, topics, host, pubsub, policy, gate, delivery, reservations, older, counters
                )
                logger.info(
                    "gossip up: peer %s listening on %s, topic %s",
                    network.peer_id,
                    ", ".join(network.listen_addrs),
                    settings.topic,
                )
                async with trio.open_nursery() as nursery:
                    await _start(nursery, network, bans_out)
                    yield network
                    nursery.cancel_scope.cancel()
        finally:
            await _close(host, settings.close_timeout_seconds)


async def _subscribe(pubsub: Pubsub, validators: dict[str, Callable[..., bool]]) -> None:
    """Subscribe to each topic, with its validator (run before a message is delivered or forwarded)."""
    with trio.fail_after(START_TIMEOUT_SECONDS):
        await pubsub.wait_until_ready()
    for topic, validate in validators.items():
        pubsub.set_topic_validator(topic, validate, False)
        with trio.fail_after(START_TIMEOUT_SECONDS):
            await pubsub.subscribe(topic)


def _services(
    settings: NetworkSettings,
    key_pair: KeyPair,
    topics: tuple[str, ...],
    host: Any,
    pubsub: Pubsub,
    policy: PeerPolicy,
    gate: PeerGate,
    delivery: Delivery,
    reservations: Reservations,
    older: OlderReleases,
    counters: dict[str, int],
) -> Network:
    """The NAT services, then the dialer, discovery and group fetching, each handed the gate and
    what it uses of those built before it, around a host whose pubsub is up: the `Network`."""
    bootstrap_ids: set[ID] = set()  # resolved `peers`, filled by the keeper: the relays a NATed node tries first
    nat, relay = nat_services(
        host, settings, gate, reservations, preferred_relays=lambda: sorted(bootstrap_ids, key=str)
    )
    dialer = Dialer(host, relay, gate, bootstrap_ids)
    joined = partial(has_joined, host, bootstrap_ids, settings.discover_peers)
    discovery = PeerDiscovery(
        key_pair,
        host,
        addresses=partial(advertised_addrs, host, relay, nat),
        target=settings.discover_peers,
        interval=settings.discovery_interval_seconds,
        max_tracked=settings.max_tracked_peers,
        gate=gate,
        dialer=dialer,
        dialled=partial(dialled_beside, host, bootstrap_ids),
    )
    discovery.attach()  # answer requests even with discovery off
    outbox = Outbox()
    host.set_stream_handler(GROUPS_PROTOCOL_ID, GroupServer(outbox, swarm=settings.swarm, gate=gate).handle)
    fetcher = GroupFetcher(
        host,
        swarm=settings.swarm,
        max_message_bytes=settings.max_message_bytes,
        gate=gate,
        links=dialer,
        authors=partial(_authors, host, gate, delivery, discovery),
        hand=delivery.hand,
        dial_failed=discovery.dial_failed,
    )
    return Network(
        settings=settings,
        topics=topics,
        my_id=policy.my_id,
        host=host,
        pubsub=pubsub,
        policy=policy,
        gate=gate,
        nat=nat,
        relay=relay,
        discovery=discovery,
        dialer=dialer,
        agents=PeerAgents(host, partial(open_peers, host), gate),
        keeper=BootstrapKeeper(host, settings, gate, relay, bootstrap_ids, joined=joined),
        links=ConnectionManager(
            host,
            low=settings.connections_low,
            high=settings.connections_high,
            protected=partial(must_stay, relay, bootstrap_ids, joined),
            count=gate.count,
        ),
        outbox=outbox,
        fetcher=fetcher,
        older=older,
        counters=counters,
    )


def _authors(host: Any, gate: PeerGate, delivery: Delivery, discovery: PeerDiscovery) -> list[Author]:
    """Everyone a fetch may ask: our connections (in their connection's network group) and
    discovery's records not waiting out a failed dial (in their source's), each once, but those
    whose groups come on the topic anyway (an older release, or a node beside one)."""
    now = time.time()

    def askable(peer: ID) -> bool:
        return gate.may_use(peer) and not delivery.gossips(peer.to_bytes(), now)

    connected = {p: Author(p, (), reached_group(direct_ip(host, p))) for p in open_peers(host) if askable(p)}
    known = {e.peer_id: Author(e.peer_id, tuple(e.dial_addrs), e.source_group) for e in discovery.drawable()}
    return list({**{p: a for p, a in known.items() if askable(p)}, **connected}.values())


async def _start(nursery: trio.Nursery, network: Network, bans: trio.MemoryReceiveChannel[ID]) -> None:
    """Run the network's services in `nursery`, in the order they were built."""
    settings, relay = network.settings, network.relay
    known, dials_back = network.discovery.addrs_of, partial(speaks, network.host, protocol=GROUPS_PROTOCOL_ID)
    links = RelayedLinks(
        network.host, relay.slots(), dialer=network.dialer, gate=network.gate, known_addrs=known, dials_back=dials_back
    )
    nursery.start_soon(cut_off_banned, bans, network.host, network.discovery, settings.close_timeout_seconds)
    await nursery.start(relay.run)
    await nursery.start(links.run)  # relayed links that end are dialled again
    relay.set_reachability(network.nat.status)
    await nursery.start(network.nat.run)
    for address in settings.peers:
        nursery.start_soon(network.keeper.keep, address)
    if settings.discover_peers > 0:
        await nursery.start(network.discovery.run)
    await nursery.start(network.agents.run)
    await nursery.start(network.links.run)
    await nursery.start(PubsubStreams(network.host, network.pubsub, network.gate).run)  # where its first open failed
    if settings.exchange == "fetch":
        await nursery.start(network.fetcher.run)


async def _close(host: Any, timeout: float) -> None:
    # Exiting host.run() alone leaves peers' TCP connections open (they do not notice for a
    # long time); close() can hang on a crashed peer, so bound it.
    with trio.move_on_after(timeout) as scope:
        scope.shield = True
        await host.close()
    if scope.cancelled_caught:
        logger.warning("host close timed out after %.1f s", timeout)


async def serve_network(
    settings: NetworkSettings,
    key_pair: KeyPair,
    incoming: ArrivalSink,
    *,
    counters: dict[str, int] | None = None,
    extra_topics: tuple[str, ...] = (),
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """`open_network` as a task of the caller's nursery: `net = await nursery.start(partial(
    serve_network, ...))`; the network runs until that nursery is cancelled."""
    async with open_network(settings, key_pair, incoming, counters=counters, extra_topics=extra_topics) as network:
        task_status.started(network)
        await trio.sleep_forever()


__all__ = ["Arrival", "Network", "open_network", "serve_network"]
