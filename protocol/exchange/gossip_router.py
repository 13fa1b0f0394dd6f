"""How the network's libp2p parts are built: the GossipSub router and its guarded pubsub,
and the NAT traversal services (AutoNAT-style reachability, circuit relay). One job: turn
`NetworkSettings` into configured py-libp2p 0.8.1 objects; `network.py` runs them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub

from sapo.protocol.exchange.gossip import Delivery, unasked_groups
from sapo.protocol.exchange.older_releases import RolloutsForOlderReleases
from sapo.protocol.exchange.pubsub_guards import GuardedPubsub
from sapo.protocol.peers.peer_policy import PeerPolicy
from sapo.protocol.reach.reachability import ReachabilityService
from sapo.protocol.reach.relay import RelayService, Reservations, relay_limits
from sapo.protocol.reach.relay_guards import RelayBudget
from sapo.protocol.settings import NetworkSettings
from sapo.protocol.toolkit.peer_gate import PeerGate

# Room for the RPC envelope around one message: protobuf tags, from/seqno/topic, the 64-byte
# signature, the 36-byte key and the sender's signed peer record that py-libp2p attaches.
RPC_OVERHEAD_BYTES = 16 * 1024
# A pubsub RPC may batch a few messages (mcache replays, IWANT answers): allow two full ones.
RPC_MESSAGES_PER_FRAME = 2
# How long GossipSub keeps a message for a peer that has connected but not yet subscribed.
PENDING_SECONDS = 2.0


def gossip_router(settings: NetworkSettings, readers: Callable[[], Iterable[ID]] | None = None) -> GossipSub:
    """`readers()`: in fetch mode, the only peers a message on the rollouts topic goes to (the
    established older releases, older_releases.py); None in gossip mode (the mesh, as GossipSub)."""
    return RolloutsForOlderReleases(
        rollouts_topic=settings.topic,
        readers=readers,
        # 1.1 only: 1.2 sends an IDONTWANT to every mesh peer per message, which about
        # doubled CPU per message in measurements; 1.3+ adds nothing we use.
        protocols=[PROTOCOL_ID_V11],
        # D=6, D_low=4, D_high=12 (the defaults) are the GossipSub spec's: with 3 nodes every
        # peer is in the mesh, with 32 each node keeps 4-12 mesh links (log-depth spread).
        degree=settings.mesh_degree,
        degree_low=settings.mesh_degree_low,
        degree_high=settings.mesh_degree_high,
        heartbeat_interval=settings.heartbeat_seconds,  # 0.8.1 annotates int; it sleeps a float
        # The default limit of 10 msg/s per (forwarder, topic) also throttles our own
        # publishes and silently drops the rest; a node publishes a burst of rollouts
        # per round, so allow 50/s (about the measured per-process ceiling).
        max_messages_per_topic_per_second=50.0,
        # "Adaptive gossip" stretches the heartbeat to 30-60 s when the mesh is smaller
        # than D, i.e. always in a swarm of 3-6 nodes. Keep the heartbeat we asked for.
        adaptive_gossip_enabled=False,
        # Messages wait here for a connected peer whose subscription has not arrived yet, for
        # the moment between its connecting and subscribing. A peer that never subscribes (a
        # relay or bootstrap that gossips another topic) kept 100 of them for 30 s, and each
        # message past that logged a WARNING (370 in two minutes in test_relay_limits.py).
        pending_messages_ttl=PENDING_SECONDS,
    )


def guarded_pubsub(
    host: Any,
    router: GossipSub,
    settings: NetworkSettings,
    gate: PeerGate,
    policy: PeerPolicy,
    delivery: Delivery,
    is_older: Callable[[ID], bool],
) -> GuardedPubsub:
    """The pubsub with its guards: the network's `gate`, the `policy`'s bucket per author, the
    `delivery` of what comes in, and in fetch mode the topic's groups taken only from the
    authors `is_older` says are older releases."""
    fetching = settings.exchange == "fetch"
    return GuardedPubsub(
        host,
        router,
        gate=gate,
        admit_author=policy.admit_author,
        deliver=delivery.deliver,
        unasked=unasked_groups(settings.topic, is_older) if fetching else None,
        close_timeout=settings.close_timeout_seconds,
        strict_signing=True,  # every message is Ed25519-signed and verified on every hop
        # Inbound frames bigger than this reset the stream before parsing. Leave room for
        # a couple of max-size messages plus envelope so the topic validator, not the
        # frame limit, rejects a merely oversized message (and counts it).
        max_inbound_rpc_size=RPC_MESSAGES_PER_FRAME * settings.max_message_bytes + RPC_OVERHEAD_BYTES,
    )


def nat_services(
    host: Any,
    settings: NetworkSettings,
    gate: PeerGate,
    reservations: Reservations,
    preferred_relays: Callable[[], list[ID]],
) -> tuple[ReachabilityService, RelayService]:
    """The relay (keeping `reservations`, which the host's identify reads), then reachability,
    which tells it when to relay and when to reserve; `preferred_relays()` are the operator's
    bootstrap peers, tried first and asked for dial-backs at once."""
    relay = RelayService(
        host,
        relay=settings.relay,
        limits=relay_limits(
            reservations=settings.relay_max_reservations,
            circuits_per_peer=settings.relay_max_circuits_per_peer,
            circuit_bytes=settings.relay_max_circuit_bytes,
            circuit_seconds=settings.relay_max_circuit_seconds,
        ),
        relays_to_reserve=settings.relays_to_reserve,
        hole_punching=settings.hole_punching,
        gate=gate,
        preferred_relays=preferred_relays,
        reservations=reservations,
        budget=RelayBudget(
            max_circuits=settings.relay_max_circuits,
            bytes_per_second=settings.relay_max_bytes_per_second,
            bytes_per_hour=settings.relay_max_bytes_per_hour,
        ),
    )
    reachability = ReachabilityService(
        host,
        mode=settings.reachability,
        interval=settings.reachability_check_seconds,
        gate=gate,
        on_change=relay.set_reachability,
        bootstrap=lambda peer: peer in preferred_relays(),  # the operator named them: asked at once
    )
    reachability.attach()  # answer dial-back requests whatever our own status
    return reachability, relay
