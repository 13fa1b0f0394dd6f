"""Which optional protocols a peer lacks: learned once, logged once, never asked again.

Any libp2p peer may connect to a node: a standard peer that speaks gossipsub and nothing of
ours, a relay that does not gossip. Such a peer is not at fault, and neither are we. Our node
still used to ask it, every 1-10 s, for what it never had (`/sapo/peers/1` discovery,
`/libp2p/autonat/1.0.0` dial-backs, a `/meshsub/1.1.0` stream), and py-libp2p logged every
refusal as an ERROR.

So, for each optional protocol, a peer lacks it when identify (which libp2p runs on every new
connection) does not list it, or when the peer refused it in multistream-select. Either way it
is remembered for that peer, logged once at INFO and counted once (`peers_without_<name>`),
and the callers do not ask it. Identify listing the protocol (a peer that upgraded) makes the
peer askable again, and so does time: after `REMEMBER_SECONDS` the peer is asked once more
(quietly), since identify is a snapshot taken when the connection opened. Relaying is not one of
these protocols: a node of ours starts relaying only once it finds itself public, after its
peers have identified it (protocol/reach/relay.py backs off from a refusal instead).

py-libp2p 0.8.1 logs each refused stream at ERROR in `BasicHost.new_stream` before the caller
sees the exception, and that first refusal can come before identify has answered. While the
network runs (network.py), `quiet_refusals()` demotes that one record ("protocols not supported") to
DEBUG: the caller gets the exception and decides what it means. Reads the host's private
`_identified_peers` (which peers identify has answered for) of that exact release.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from libp2p.host.autonat.autonat import AUTONAT_PROTOCOL_ID
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11

from sapo.protocol.wire.group_wire import PROTOCOL_ID as GROUPS_PROTOCOL_ID
from sapo.protocol.wire.peer_records import PROTOCOL_ID as DISCOVERY_PROTOCOL_ID
from sapo.training.bounded import BoundedMap

logger = logging.getLogger("sapo.gossip")

# Each optional protocol, what it is for (the log line), and its counter.
OPTIONAL: dict[str, tuple[str, str]] = {
    DISCOVERY_PROTOCOL_ID: ("peer discovery", "peers_without_discovery"),
    str(AUTONAT_PROTOCOL_ID): ("AutoNAT dial-backs", "peers_without_autonat"),
    str(PROTOCOL_ID_V11): ("gossip", "peers_without_gossip"),
    GROUPS_PROTOCOL_ID: ("group fetching: a release before 0.4.0, sent groups on the topic", "peers_without_fetch"),
}
# (peer, protocol) pairs remembered; the oldest make way (a peer seen again is identified again).
MAX_REMEMBERED = 4096
# How long a peer is not asked for a protocol it lacks; then it is asked once more, quietly.
REMEMBER_SECONDS = 600.0
# What py-libp2p's multistream-select client says when the peer refused every protocol offered.
REFUSED = "protocols not supported"


def refused_protocol(error: BaseException) -> bool:
    """Whether a failed stream open means the peer does not speak the protocol (it answered
    'na'), as opposed to a timeout, a reset or a closed connection."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if REFUSED in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


class PeerProtocols:
    """The optional protocols each peer lacks, as identify and refusals told us.

    `lacks(peer, protocol)` before asking; `refused(peer, protocol, error)` after a failed ask
    (True when the failure was the peer lacking it, which is then remembered)."""

    def __init__(
        self,
        host: Any,
        count: Callable[[str], None],
        max_remembered: int = MAX_REMEMBERED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.count = count
        self.max_remembered = max_remembered
        self.clock = clock
        self._missing: BoundedMap[tuple[ID, str], float] = BoundedMap(max_remembered)  # -> ask again after
        self._told: BoundedMap[tuple[ID, str], None] = BoundedMap(max_remembered)  # logged and counted already

    def lacks(self, peer: ID, protocol: str) -> bool:
        listed = self._identified_protocols(peer)
        if listed is not None and protocol in listed:
            self._missing.pop((peer, protocol), None)
            return False
        until = self._missing.get((peer, protocol))
        if until is not None:
            if self.clock() < until:
                return True
            self._missing.pop((peer, protocol))
            return False  # long enough: ask once more (a refusal is remembered again, quietly)
        if listed is not None:  # identified, and the protocol is not among its list
            self._remember(peer, protocol, "identify does not list it")
            return True
        return False  # not identified yet: asking is how we find out

    def refused(self, peer: ID, protocol: str, error: BaseException) -> bool:
        if not refused_protocol(error):
            return False
        self._remember(peer, protocol, "it refused the protocol")
        return True

    def _remember(self, peer: ID, protocol: str, how: str) -> None:
        key = (peer, protocol)
        self._missing.put(key, self.clock() + REMEMBER_SECONDS)
        if key in self._told:
            return
        self._told.put(key, None)
        what, counter = OPTIONAL.get(protocol, (protocol, "peers_without_other"))
        self.count(counter)
        logger.info("peer %s does not speak %s (%s; %s): not asking it again", peer, protocol, what, how)

    def _identified_protocols(self, peer: ID) -> list[str] | None:
        """The protocols identify listed for `peer`; None until identify has answered."""
        if peer not in getattr(self.host, "_identified_peers", {}):
            return None
        try:
            return [str(p) for p in self.host.get_peerstore().get_protocols(peer)]
        except Exception:  # noqa: BLE001 - forgotten by the peerstore meanwhile
            return None


class _RefusalIsNotAnError(logging.Filter):
    """Demotes py-libp2p's ERROR for a stream the peer refused (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        message = record.getMessage()
        if not (message.startswith("Failed to open stream to peer") and REFUSED in message):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


@asynccontextmanager
async def quiet_refusals() -> AsyncIterator[None]:
    """While inside, a refused stream is a DEBUG record in py-libp2p's host log, not an ERROR
    (async only to share an `async with` with the host it is for)."""
    library = logging.getLogger("libp2p.host.basic_host")
    quiet = _RefusalIsNotAnError()
    library.addFilter(quiet)
    try:
        yield
    finally:
        library.removeFilter(quiet)
