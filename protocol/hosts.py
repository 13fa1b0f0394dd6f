"""The one way this project makes a libp2p host (TCP, Noise only, yamux), and who it is connected to.

A default py-libp2p host also offers TLS, secio and /plaintext/2.0.0, and accepts a
plaintext-only dialler; gossip and the judge both go through here so neither can.
"""

from __future__ import annotations

from typing import Any

import multiaddr
from libp2p import new_host
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519
from libp2p.peer.id import ID
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux


def new_noise_host(key_pair: Any, listen: list[multiaddr.Multiaddr], psk: str | None = None) -> Any:
    """A host with Noise as its only security protocol and yamux as its muxer; `psk` (hex)
    turns on libp2p pnet for a private swarm."""
    return new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519().private_key)},
        muxer_opt={YAMUX_PROTOCOL_ID: Yamux},
        listen_addrs=listen,
        psk=psk,
    )


def open_peers(host: Any) -> list[ID]:
    """Peers with an open connection. The host's own list keeps a closed connection for a while
    (until the swarm's cleanup task runs, which a busy node may not get to for seconds)."""
    network = host.get_network()
    return [
        peer
        for peer in host.get_connected_peers()
        if any(not connection.is_closed for connection in network.get_connections(peer))
    ]
