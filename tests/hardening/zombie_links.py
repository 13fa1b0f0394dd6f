"""Shared parts of the inbound-slot attacks (test_attack5_*.py): a node whose library limiter is
cut to a handful of slots, and attackers that are real py-libp2p hosts on 127.0.0.1.

A *stuffed* link is one whose far end stops reading and then sends yamux PINGs: the node answers
each from its read loop (yamux.py `TYPE_PING`: `_write_frame` inline), its socket's send buffer
fills, and its next write to that peer waits for ever (a peer whose kernel keeps acking with a
zero window never times out). That is all a frozen honest peer (SIGSTOP, a swapped-out laptop)
does too, except the pings.
"""

from __future__ import annotations

import struct
from typing import Any

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.stream_muxer.yamux.yamux import FLAG_SYN, TYPE_PING, YAMUX_HEADER_FORMAT

from sapo.protocol.toolkit.hosts import new_noise_host, open_peers

LOOPBACK = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
PINGS = struct.pack(YAMUX_HEADER_FORMAT, 0, TYPE_PING, FLAG_SYN, 0, 7) * 1000  # 12 KB a write


def cut_slots(host: Any, slots: int) -> None:
    """The library's own inbound limiter, with `slots` tokens instead of 250."""
    host.get_network()._inbound_limiter = trio.CapacityLimiter(slots)


def slots_held(host: Any) -> int:
    return int(host.get_network()._inbound_limiter.borrowed_tokens)


def census(host: Any) -> dict[str, int]:
    """What the node's parts believe: slots held, connections the swarm has registered (its
    max_connections counts these), and peers sapo sees connected (open_peers)."""
    return {
        "slots": slots_held(host),
        "registered": len(host.get_network().get_connections()),
        "open_peers": len(open_peers(host)),
    }


class Attacker:
    """One key, one link to `target`, from a real host."""

    def __init__(self, target: str) -> None:
        self.info = info_from_p2p_addr(multiaddr.Multiaddr(target))
        self.host = new_noise_host(create_new_key_pair(), [LOOPBACK])
        self.connected = False
        self.sent = 0

    @property
    def peer_id(self) -> ID:
        return self.host.get_id()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with self.host.run([LOOPBACK]):
            try:
                with trio.fail_after(10):
                    await self.host.connect(self.info)
                self.connected = True
            except Exception:  # noqa: BLE001 - refused: the node is out of slots
                self.connected = False
            task_status.started()
            await trio.sleep_forever()

    def _session(self) -> Any:
        for connection in self.host.get_network().get_connections(self.info.peer_id):
            return connection.muxed_conn.secured_conn
        return None

    async def stuff(self, seconds: float = 3.0) -> int:
        """Stop reading, then send PINGs until the node's answers back up (or `seconds`): how many
        bytes were sent."""
        session = self._session()
        if session is None:
            return 0

        async def never() -> bytes:
            await trio.sleep_forever()
            return b""

        session.conn.read_msg = never  # the next read waits for ever: our kernel's window closes
        with trio.move_on_after(seconds):
            try:
                while True:
                    await session.write(PINGS)
                    self.sent += len(PINGS)
            except Exception:  # noqa: BLE001 - the node closed it (not stuffed after all)
                pass
        return self.sent

    async def drop(self) -> None:
        """Close our end of the socket (the process dies, say)."""
        session = self._session()
        if session is not None:
            await session.conn.read_writer.read_write_closer.close()


async def newcomer_gets_in(target: str) -> bool:
    """Whether a fresh honest host can connect to `target` and stay connected for a moment."""
    host = new_noise_host(create_new_key_pair(), [LOOPBACK])
    info = info_from_p2p_addr(multiaddr.Multiaddr(target))
    async with host.run([LOOPBACK]):
        try:
            with trio.fail_after(10):
                await host.connect(info)
            await trio.sleep(0.5)  # a refused connection is closed at once
            ok = info.peer_id in open_peers(host)
        except Exception:  # noqa: BLE001 - refused
            ok = False
        with trio.move_on_after(2):
            try:
                await host.disconnect(info.peer_id)
            except Exception:  # noqa: BLE001
                pass
    return ok


SILENT_ATTACKER = "127.0.0.2"  # newcomers dial from 127.0.0.1: another address, as they would be


async def silent_connection(port: int, opened: list[int], every: float = 1.0) -> None:
    """Open a TCP connection from SILENT_ATTACKER, say nothing, and open another when the node closes
    it (at once, but at most one every `every` s: closed sooner, it would only cost both sides
    CPU; attack5_experiments' fast attacker passes 0)."""
    while True:
        began = trio.current_time()
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=SILENT_ATTACKER)
        except OSError:
            await trio.sleep(0.1)
            continue
        opened[0] += 1
        async with stream:
            try:
                while await stream.receive_some(4096):
                    pass
            except trio.BrokenResourceError:
                pass
        await trio.sleep(max(0.0, every - (trio.current_time() - began)))
