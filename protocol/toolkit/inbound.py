"""An inbound connection gives its slot back when its link closes, not when the node stops.

Why: py-libp2p 0.8.1's swarm admits inbound connections through a limiter of
`max_connections - min_connections` slots (300 - 50 = 250), and the task that holds a slot then
waits for the *swarm* to finish (`_do_handle_inbound_connection`: `manager.wait_finished()`), not
for its connection to close. (The task must outlive its link, since trio's `serve_listeners`
closes a stream when its handler returns; 0.8.1 makes it outlive every link.) So every inbound
connection a node ever accepted kept its slot, and from the 250th on the node closed each new one
at once, before a byte was read, for the rest of its life. A node's fetchers' links are inbound at
the authors they draw, so a busy node got there in minutes: in the wild bench (issue #41) all
three seeds refused every newcomer from about 17 minutes into the run, and a node left alone for
a month would have served only the peers already connected to it.

How: the node's swarm handles a TCP connection as 0.8.1 does (its connection gate, then the
security and muxer upgrade, which register the link), waits for that link's muxer to close, and
returns, so the slot comes back with the link. The limiter stays as 0.8.1 means it: at most 250
inbound links open at once. A pre-multiplexed transport (QUIC) goes to 0.8.1's own handler; the
node listens on TCP only.

A slot is taken before a byte is read, and a connection that never finishes its handshake keeps
it for `inbound_upgrade_timeout` (10 s): 250 silent TCP connections from one address, about 25
connects a second and no key, kept every newcomer out (tests/hardening/
test_attack5_stalled_handshakes.py; 0.8.1 had the same hole). So at most HANDSHAKING connections
are in their handshake at once, and a new one past that closes the oldest of the place (IPv4
/16, IPv6 /32, or the address itself on our host and LAN) that has the most in handshake: an
honest handshake takes milliseconds, and an address that keeps opening connections only closes
its own.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

from libp2p.abc import IMuxedConn
from libp2p.network.connection.raw_connection import RawConnection

logger = logging.getLogger("sapo.gossip")

# Inbound connections in their security and muxer handshake at once (of the library's 250 slots).
HANDSHAKING = 64


class Handshakes:
    """Inbound connections in their handshake, oldest first, each with the place it comes from."""

    def __init__(self, most: int, group_of: Callable[[str], str]) -> None:
        self.most = most
        self.group_of = group_of
        self.pending: dict[Any, str] = {}

    def place(self, stream: Any) -> str:
        try:
            ip = stream.get_remote_address()[0]
        except Exception:  # noqa: BLE001 - no address: one place for all such
            return "unknown"
        group = self.group_of(ip)
        return ip if group == "local" else group

    async def admit(self, raw: Any, place: str) -> None:
        """Count `raw` in; past `most`, close the oldest handshake of the most crowded place."""
        self.pending[raw] = place
        if len(self.pending) <= self.most:
            return
        crowd = Counter(self.pending.values())
        most = max(crowd.values())
        oldest = next(other for other, where in self.pending.items() if crowd[where] == most)
        del self.pending[oldest]
        logger.debug("closing a handshake from %s: %d in handshake", place, len(self.pending) + 1)
        await _close_quietly(oldest)  # its upgrade fails and gives its slot back

    def done(self, raw: Any) -> None:
        self.pending.pop(raw, None)


def release_slots_with_links(swarm: Any, group_of: Callable[[str], str]) -> None:
    """Make `swarm` (0.8.1's Swarm) end each inbound connection's task when its link closes, with
    at most HANDSHAKING of them in their handshake; `group_of(ip)` is the network group of an
    address ("local" for our host and LAN)."""
    handshakes = Handshakes(HANDSHAKING, group_of)
    swarm._do_handle_inbound_connection = partial(
        _handle_until_closed, swarm, handshakes, swarm._do_handle_inbound_connection
    )


async def _handle_until_closed(
    swarm: Any, handshakes: Handshakes, library_handler: Any, stream: Any, maddr: Any, failure_event: Any
) -> None:
    if isinstance(stream, IMuxedConn):  # QUIC, WebTransport: not a transport of ours
        await library_handler(stream, maddr, failure_event)
        return
    remote = swarm._build_remote_multiaddr(stream)
    if remote is not None and not await swarm.connection_gate.is_allowed(remote):
        await _close_quietly(stream)
        return
    raw = RawConnection(stream, False)
    await handshakes.admit(raw, handshakes.place(stream))
    try:
        muxed = await swarm.upgrade_inbound_raw_conn(raw, maddr)
    except Exception as error:  # noqa: BLE001 - a stranger's failed handshake is routine, as in 0.8.1
        logger.debug("inbound connection from %s failed: %s", remote, error)
        await _close_quietly(raw)
        return
    finally:
        handshakes.done(raw)
    # the link is registered; this task (and its slot) lasts exactly as long as the link does
    await muxed.event_closed.wait()


async def _close_quietly(closer: Any) -> None:
    try:
        await closer.close()
    except Exception:  # noqa: BLE001 - already closed by the peer is fine
        pass


__all__ = ["HANDSHAKING", "Handshakes", "release_slots_with_links"]
