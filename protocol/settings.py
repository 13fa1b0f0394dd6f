"""The one model of a node's network settings: gossip transport, swarm membership and peers.

The daemon, the network, the judge client and the tests all read this same model, so a
value is checked once, here, when the settings are loaded: before any model or library loads.
It imports only pydantic and `multiaddr` (py-libp2p itself takes 1-2 s to import), so a bad
`--peers` is refused in a fraction of a second.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

import multiaddr
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SWARM_KEY_HEADER = ("/key/swarm/psk/1.0.0/", "/base16/")
PEER_ID_EXAMPLE = "12D3KooW..."


# The relay's overall budget, shared by every reservation (relay_guards.RelayBudget). Relaying
# costs this node's Python about 33 ms of CPU per MB here (`python -m tests.protocol.relay_cost`:
# 39 ms a MB through a circuit against 6 ms direct, an upper bound), so 1 MiB/s is ~3.5 % of a
# core taken from training at most; past it circuits are slowed, not cut.
RELAY_BYTES_PER_SECOND = 1024 * 1024
# Bytes the relay carries in an hour at most (a sustained 0.3 MiB/s): what a node lends strangers
# of its uplink. Past it new circuits are refused and open ones cut until the bucket refills.
RELAY_BYTES_PER_HOUR = 1024**3
RELAY_MAX_CIRCUITS = 64


def rollout_topic(swarm: str) -> str:
    """The GossipSub topic a swarm's rollout groups travel on (the wire contract)."""
    return f"sapo/{swarm}/rollouts/1"


def logprobs_topic(swarm: str) -> str:
    """The GossipSub topic of the log-probs peers share for their groups (`SharedLogprobs`): only
    nodes that weigh peers' completions by them subscribe."""
    return f"sapo/{swarm}/logprobs/1"


def check_multiaddr(address: str, what: str, example: str) -> multiaddr.Multiaddr:
    try:
        return multiaddr.Multiaddr(address)
    except Exception as error:
        raise ValueError(f"{what} {address!r} is not a multiaddr ({error}); e.g. {example}") from None


class AddressError(ValueError):
    """A peer address we cannot use; the message names it and what would work."""


# /dns4, /dns6 and /dns names, and the address family each asks the resolver for
NAME_PROTOCOLS = {"dns": socket.AF_UNSPEC, "dns4": socket.AF_INET, "dns6": socket.AF_INET6}
ADDRESS_EXAMPLE = (
    f"/ip4/10.0.0.5/tcp/4001/p2p/{PEER_ID_EXAMPLE}, /dns4/bootstrap.example.org/tcp/4001/p2p/{PEER_ID_EXAMPLE} "
    "or /dnsaddr/example.org"
)


def peer_address_shape(text: str) -> tuple[str, str | None]:
    """("ip" | "name" | "dnsaddr", the base58 peer id it names or None for a bare /dnsaddr) for
    a `peers` entry of an accepted shape: /ip4|ip6|dns|dns4|dns6/<host>/tcp/<port>/p2p/<id>, or
    /dnsaddr/<name>[/p2p/<id>] whose TXT records list the peers. Else AddressError."""
    try:
        address = multiaddr.Multiaddr(text)
        names = [p.name for p in address.protocols()]
    except Exception as error:  # noqa: BLE001 - multiaddr raises several types
        raise AddressError(f"peer address {text!r} is not a multiaddr ({error}); e.g. {ADDRESS_EXAMPLE}") from None
    if names[:1] == ["dnsaddr"]:
        if names not in (["dnsaddr"], ["dnsaddr", "p2p"]):
            raise AddressError(
                f"peer address {text!r}: a /dnsaddr takes only an optional /p2p/<peer id> after the name; "
                f"e.g. {ADDRESS_EXAMPLE}"
            )
        return "dnsaddr", address.get_peer_id() if "p2p" in names else None
    if len(names) != 3 or names[1:] != ["tcp", "p2p"] or names[0] not in ("ip4", "ip6", *NAME_PROTOCOLS):
        raise AddressError(
            f"peer address {text!r} is not /ip4|ip6|dns|dns4|dns6/<host>/tcp/<port>/p2p/<peer id> "
            f"or /dnsaddr/<name>; e.g. {ADDRESS_EXAMPLE}"
        )
    return ("ip" if names[0] in ("ip4", "ip6") else "name"), address.get_peer_id()


def check_peer_address(address: str, what: str) -> str:
    """A `peers`-shaped address that names its peer (the judge's; a bootstrap may be a bare /dnsaddr)."""
    _, peer = peer_address_shape(address)
    if peer is None:
        raise ValueError(
            f"{what} {address!r} has no /p2p/<peer id> part; e.g. /ip4/192.168.1.20/tcp/4101/p2p/{PEER_ID_EXAMPLE}"
        )
    return address


def check_peer_id(peer: str, what: str) -> str:
    try:
        multiaddr.Multiaddr(f"/p2p/{peer}")
    except Exception:
        raise ValueError(f"{what} {peer!r} is not a base58 peer id; e.g. {PEER_ID_EXAMPLE}") from None
    return peer


def load_swarm_key(path: Path) -> str:
    """The 64-hex-char pre-shared key from a standard libp2p `swarm.key` file:
    `/key/swarm/psk/1.0.0/`, `/base16/`, then the key, one per line."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read swarm key {path}: {error}") from None
    return parse_swarm_key(text, str(path))


def parse_swarm_key(text: str, where: str = "swarm key") -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 3 or tuple(lines[:2]) != SWARM_KEY_HEADER:
        raise ValueError(
            f"swarm key {where} is not a libp2p swarm.key file: expected the lines "
            f"{SWARM_KEY_HEADER[0]!r}, {SWARM_KEY_HEADER[1]!r} and 64 hex characters. Make one with: "
            "printf '/key/swarm/psk/1.0.0/\\n/base16/\\n%s\\n' $(openssl rand -hex 32) > swarm.key"
        )
    key = lines[2].lower()
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"swarm key {where}: the key line must be 64 hex characters (32 bytes)")
    return key


class NetworkSettings(BaseModel):
    """How a node joins its swarm and talks to peers. Every field is a `sapo-node start` flag."""

    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not a no-op

    listen: str = Field(
        default="/ip4/0.0.0.0/tcp/4001", description="multiaddr to listen on (TCP; port 0 = any free port)"
    )
    peers: list[str] = Field(
        default_factory=list,
        description="bootstrap peers: /ip4|ip6|dns4|dns6|dns/<host>/tcp/<port>/p2p/<peer id>, or /dnsaddr/<name> "
        "(TXT records list the peers); names are resolved by the OS resolver (hosts file, Docker DNS) before "
        "every dial, and each peer is redialled with back-off until connected, and again whenever it drops",
    )
    swarm: str = Field(
        default="default",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="swarm name; the topic is sapo/<swarm>/rollouts/1",
    )
    swarm_key: Path | None = Field(
        default=None,
        description="libp2p swarm.key file (/key/swarm/psk/1.0.0/, /base16/, 64 hex chars): a private swarm "
        "whose every node has the same key; nodes without it cannot connect",
    )
    allow_peers: list[str] = Field(
        default_factory=list,
        description="if given, only these peer ids may connect and have their groups accepted or relayed",
    )
    identity_seed: str | None = Field(
        default=None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="derive a new identity from this 32-byte hex seed (fixed bootstrap ids for local demos only: "
        "anyone who knows the seed can act as this node)",
    )
    max_message_bytes: int = Field(
        default=256 * 1024,
        ge=4096,
        le=900 * 1024,
        description="largest rollout message sent or accepted, bytes (under py-libp2p's fixed 1 MiB outbound RPC limit)",
    )
    compress: bool = Field(default=True, description="zlib-compress outgoing messages when it makes them smaller")
    accept_other_rg_versions: bool = Field(
        default=False,
        description="accept groups from peers on another reasoning-gym release (their problems may not regenerate identically)",
    )
    wait_for_peers: int = Field(
        default=0, ge=0, le=1000, description="before the first round, wait until this many peers are connected..."
    )
    wait_for_peers_seconds: float = Field(
        default=60.0, ge=0, description="...but no longer than this; then train alone and let peers join later"
    )
    exchange: Literal["fetch", "gossip"] = Field(
        default="fetch",
        description="how groups travel: fetch (each round, ask authors drawn by network group from the peers we know for "
        "about the groups we train on, /sapo/groups/1; a node's cost does not grow with the swarm, "
        "docs/bench/scale.md) or gossip (every group to every node on the rollouts topic, as before 0.4.0); "
        "with fetch, our groups still go on the topic while a connected peer is an older release",
    )
    heartbeat_seconds: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="GossipSub heartbeat (py-libp2p's default of 120 s makes the mesh react very slowly)",
    )
    mesh_degree: int = Field(default=6, ge=1, le=64, description="GossipSub D: mesh links kept per node")
    mesh_degree_low: int = Field(
        default=4, ge=0, le=64, description="GossipSub D_low: below this many mesh links, graft more"
    )
    mesh_degree_high: int = Field(
        default=12, ge=1, le=128, description="GossipSub D_high: above this many mesh links, prune"
    )
    dial_backoff_initial: float = Field(
        default=1.0, gt=0, description="first delay (s) before redialling a bootstrap peer"
    )
    dial_backoff_max: float = Field(default=10.0, gt=0, description="cap (s) on the exponential redial delay")
    close_timeout_seconds: float = Field(
        default=5.0, gt=0, description="bound on closing the host at shutdown (close() can hang on a crashed peer)"
    )
    discover_peers: int = Field(
        default=4,
        ge=0,
        le=64,
        description="ask connected peers for the signed records of peers they know and dial them until this many "
        "peers are connected (0 = only the --peers); lets a swarm grow past one bootstrap node's mesh",
    )
    discovery_interval_seconds: float = Field(
        default=10.0, gt=0, le=3600, description="ask a random connected peer for peers this often"
    )
    max_tracked_peers: int = Field(default=256, ge=1, le=65_536, description="most discovered peer records kept")
    connections_low: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="once more than --connections-high peers are connected, the links others opened to us (from the "
        "most crowded network groups first), then ours, are closed down to this many; relays, relayed links and, until "
        "--discover-peers others are connected, the --peers are kept",
    )
    connections_high: int = Field(
        default=96, ge=1, le=4096, description="most peers connected before links are closed (see --connections-low)"
    )
    peer_message_rate: float = Field(
        default=50.0,
        gt=0,
        description="messages per second one peer may publish (token bucket, by its signed sequence numbers); more "
        "are dropped and lower its score, and a flooder is banned; keep it above any honest node's rate",
    )
    peer_message_burst: int = Field(default=100, ge=1, description="messages one peer may publish in a burst")
    ban_seconds: float = Field(
        default=600.0,
        gt=0,
        description="a peer whose score falls too low (flooding, junk, bad signatures) is disconnected and refused for this long",
    )
    relay: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="serve as a Circuit Relay v2 relay for peers behind NAT: auto once this node finds it is "
        "publicly reachable (so public bootstrap nodes relay), on always, off never",
    )
    relay_max_reservations: int = Field(
        default=64, ge=1, le=4096, description="as a relay: most peers holding a relay slot on this node at once"
    )
    relay_max_circuits_per_peer: int = Field(
        default=16, ge=1, le=1024, description="as a relay: most open circuits to one peer that holds a slot here"
    )
    relay_max_circuit_bytes: int = Field(
        default=256 * 1024 * 1024,
        gt=0,
        description="as a relay: bytes one circuit may carry (both ways) before it is reset; the two peers then "
        "dial again (through a relay, or directly after hole punching)",
    )
    relay_max_circuit_seconds: int = Field(
        default=3600, gt=0, description="as a relay: seconds one circuit may stay open before it is reset"
    )
    relay_max_circuits: int = Field(
        default=RELAY_MAX_CIRCUITS,
        ge=1,
        le=65_536,
        description="as a relay: most circuits open at once, all reservations together; past it a CONNECT is "
        "refused (RESOURCE_LIMIT_EXCEEDED)",
    )
    relay_max_bytes_per_second: int = Field(
        default=RELAY_BYTES_PER_SECOND,
        ge=1024,
        description="as a relay: bytes per second all circuits together may carry (relaying costs ~33 ms of CPU "
        "a MB, so the default takes at most a 30th of a core from training); faster traffic is slowed",
    )
    relay_max_bytes_per_hour: int = Field(
        default=RELAY_BYTES_PER_HOUR,
        ge=1024 * 1024,
        description="as a relay: bytes all circuits together may carry in an hour (a token bucket); once spent, "
        "new circuits are refused and open ones cut (RESOURCE_LIMIT_EXCEEDED) until it refills",
    )
    relays_to_reserve: int = Field(
        default=2,
        ge=0,
        le=8,
        description="behind NAT: hold a slot on this many relays (bootstrap peers first) and advertise the relayed "
        "addresses (/p2p-circuit); 0 = never reserve (unreachable behind NAT)",
    )
    reachability: Literal["auto", "public", "private"] = Field(
        default="auto",
        description="whether peers can dial this node: auto asks connected peers to dial it back (AutoNAT); "
        "public or private skips the check",
    )
    reachability_check_seconds: float = Field(
        default=300.0, gt=0, le=86_400, description="with --reachability auto: ask peers to dial us back this often"
    )
    hole_punching: bool = Field(
        default=True,
        description="upgrade relayed connections to direct ones by hole punching (DCUtR); the relayed connection "
        "is closed a minute after the direct one is up",
    )

    @property
    def topic(self) -> str:
        return rollout_topic(self.swarm)

    @property
    def psk(self) -> str | None:
        """The swarm key's 64 hex chars (the file was checked when the settings were loaded)."""
        return load_swarm_key(self.swarm_key) if self.swarm_key is not None else None

    @field_validator("listen")
    @classmethod
    def _listen_is_a_multiaddr(cls, listen: str) -> str:
        check_multiaddr(listen, "listen address", "/ip4/0.0.0.0/tcp/4001")
        return listen

    @field_validator("peers")
    @classmethod
    def _peers_are_dialable(cls, peers: list[str]) -> list[str]:
        for address in peers:
            peer_address_shape(address)  # AddressError is a ValueError naming the entry
        return peers

    @field_validator("allow_peers")
    @classmethod
    def _allowed_are_peer_ids(cls, peers: list[str]) -> list[str]:
        return [check_peer_id(peer, "allowed peer") for peer in peers]

    @field_validator("swarm_key")
    @classmethod
    def _swarm_key_is_readable(cls, path: Path | None) -> Path | None:
        if path is not None:
            load_swarm_key(path)
        return path

    @model_validator(mode="after")
    def _consistent(self) -> NetworkSettings:
        if not self.mesh_degree_low <= self.mesh_degree <= self.mesh_degree_high:
            raise ValueError(
                f"mesh degrees must satisfy mesh_degree_low ({self.mesh_degree_low}) <= mesh_degree "
                f"({self.mesh_degree}) <= mesh_degree_high ({self.mesh_degree_high})"
            )
        if self.connections_high < self.connections_low:
            raise ValueError(
                f"connections_high ({self.connections_high}) must be >= connections_low ({self.connections_low})"
            )
        if self.dial_backoff_max < self.dial_backoff_initial:
            raise ValueError(
                f"dial_backoff_max ({self.dial_backoff_max}) must be >= dial_backoff_initial ({self.dial_backoff_initial})"
            )
        return self
