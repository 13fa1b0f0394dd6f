"""ATTACK (h-atk10, on 014380f): what is left of py-libp2p 0.8.1's 100 extra reads of an ended
stream once inbound handshakes fail at their first empty read (inbound.py `HandshakeConnection`).

0.8.1's `read_exactly` reads an ended TCP stream 101 times before it gives up (io/utils.py; the
stream reads b"" at EOF and after a local close, io/trio.py). 014380f stops that for an inbound
connection *in its handshake* only. This script counts, on a real `new_noise_host` on 127.0.0.1,
the empty reads the node makes, and how long the node's inbound slot outlives the far end's
close, in three cases:

  in-handshake  a stranger on 127.0.0.2 opens a TCP connection, says one byte and closes it
                (014380f's case: 1 read)
  after         a real py-libp2p peer completes Noise + yamux, then its TCP connection ends
                (the link's read loop: noise's `read_exactly(raw, 2)`, 0.8.1's 101 reads; the
                slot is held until the loop gives up and yamux sets `event_closed`)
  mid_frame     the same, but the peer's last bytes are a yamux DATA frame cut short (yamux reads
                the body, 101 reads, logs an error, reads on for a header: 101 more)
  outbound      the node dials 127.0.0.2, where a listener accepts and closes at once (the
                node's own dials use the library's RawConnection: 101 reads)

each on a quiet event loop and on one made busy by 3 tasks that block 5 ms between checkpoints
(about what a loaded node looks like to trio; CI's failure had its evicted handshakes held 3.5 s).

Run: .venv/bin/python -m tests.hardening.attack10_handshake_reads   (about 20 s)
     ATTACK10_FIX=1 .venv/bin/python -m tests.hardening.attack10_handshake_reads
       the same with the suggested fix patched in: the first empty read ends every TCP connection
       the node has, inbound for the link's whole life and its own dials too
"""

from __future__ import annotations

import os
import struct
import time
from collections import defaultdict
from typing import Any

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.io.trio import TrioTCPStream
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.stream_muxer.yamux.yamux import FLAG_SYN, TYPE_DATA, YAMUX_HEADER_FORMAT

from sapo.protocol.toolkit.hosts import cut_connections, new_noise_host

LOOPBACK = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
STRANGER_IP = "127.0.0.2"

empty_reads: dict[int, int] = defaultdict(int)  # id(TrioTCPStream) -> reads that returned b""
ends: dict[int, tuple[Any, Any]] = {}  # id -> (sockname, peername)
_library_read = TrioTCPStream.read


async def _counting_read(self: TrioTCPStream, n: int | None = None) -> bytes:
    if id(self) not in ends:
        try:
            ends[id(self)] = (self.stream.socket.getsockname(), self.stream.socket.getpeername())
        except OSError:
            ends[id(self)] = (None, None)
    data = await _library_read(self, n)
    if not data and n != 0:
        empty_reads[id(self)] += 1
    return data


TrioTCPStream.read = _counting_read  # type: ignore[method-assign]

if os.environ.get("ATTACK10_FIX"):
    from libp2p.transport.tcp.tcp import TCP

    from sapo.protocol.toolkit.inbound import HandshakeConnection

    # the suggested fix, patched in: an empty read (n != 0) of a TCP stream is its end, always
    HandshakeConnection.handshaking = property(lambda self: True, lambda self, value: None)  # type: ignore[assignment]
    _library_dial = TCP.dial

    async def _dial(self: Any, maddr: Any, *args: Any, **kwargs: Any) -> Any:
        raw = await _library_dial(self, maddr, *args, **kwargs)
        return HandshakeConnection(raw.stream, True)

    TCP.dial = _dial  # type: ignore[method-assign]


def reads_where(local_port: int | None = None, remote_port: int | None = None) -> int:
    total = 0
    for key, (local, remote) in ends.items():
        if local_port is not None and (local is None or local[1] != local_port):
            continue
        if remote_port is not None and (remote is None or remote[1] != remote_port):
            continue
        total += empty_reads.get(key, 0)
    return total


def port_of(host: Any) -> int:
    return int(multiaddr.Multiaddr(str(host.get_addrs()[0])).value_for_protocol("tcp"))


async def busy(block_s: float) -> None:
    while True:
        time.sleep(block_s)  # noqa: ASYNC251 - CPU work elsewhere on the node's one loop, between checkpoints
        await trio.lowlevel.checkpoint()


async def slot_back(node: Any, since: float, limit: float = 30.0) -> float:
    limiter = node.get_network()._inbound_limiter
    with trio.move_on_after(limit):
        while limiter.borrowed_tokens:
            await trio.sleep(0.005)
    return trio.current_time() - since


async def in_handshake(node: Any) -> tuple[int, float]:
    port = port_of(node)
    sock = trio.socket.socket()
    await sock.bind((STRANGER_IP, 0))
    await sock.connect(("127.0.0.1", port))
    await sock.send(b"\x13")  # the first byte of "/multistream/1.0.0\n", then nothing
    limiter = node.get_network()._inbound_limiter
    with trio.fail_after(10):
        while not limiter.borrowed_tokens:
            await trio.sleep(0.005)
    before = reads_where(local_port=port)
    sock.shutdown(trio.socket.SHUT_WR)  # a FIN, not a RST (a close with unread bytes resets)
    held = await slot_back(node, trio.current_time())
    sock.close()
    return reads_where(local_port=port) - before, held


async def after_handshake(node: Any, mid_frame: bool = False) -> tuple[int, float]:
    port = port_of(node)
    client = new_noise_host(create_new_key_pair(), [LOOPBACK])
    async with client.run([LOOPBACK]):
        address = multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{port}/p2p/{node.get_id()}")
        with trio.fail_after(20):
            await client.connect(info_from_p2p_addr(address))
            while not node.get_network().get_connections(client.get_id()):
                await trio.sleep(0.01)
        await trio.sleep(0.3)
        before = reads_where(local_port=port)
        for connection in client.get_network().get_connections(node.get_id()):
            if mid_frame:  # a yamux DATA frame that opens stream 101 and says 1,000 bytes; 10 come
                header = struct.pack(YAMUX_HEADER_FORMAT, 0, TYPE_DATA, FLAG_SYN, 101, 1000)
                await connection.muxed_conn.secured_conn.write(header + b"x" * 10)
            tcp = connection.muxed_conn.secured_conn.conn.read_writer.read_write_closer.stream.stream
            tcp.socket.shutdown(trio.socket.SHUT_WR)  # a FIN; the peer goes on reading, so no RST
        held = await slot_back(node, trio.current_time())
        with trio.move_on_after(2):
            await cut_connections(client, node.get_id())
    return reads_where(local_port=port) - before, held


async def mid_frame(node: Any) -> tuple[int, float]:
    return await after_handshake(node, mid_frame=True)


async def outbound(node: Any) -> tuple[int, float]:
    listener = trio.socket.socket()
    await listener.bind((STRANGER_IP, 0))
    listener.listen(16)
    target = listener.getsockname()[1]

    kept = []

    async def drain(conn: Any) -> None:
        try:
            while await conn.recv(65536):  # what the node says is read, so our close sends no RST
                pass
        except OSError:
            pass

    async def accept_and_close(nursery: trio.Nursery) -> None:
        while True:
            conn, _ = await listener.accept()
            conn.shutdown(trio.socket.SHUT_WR)  # a FIN at once
            kept.append(conn)
            nursery.start_soon(drain, conn)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_and_close, nursery)
        stranger = ID.from_pubkey(create_new_key_pair().public_key)
        start = trio.current_time()
        try:
            with trio.fail_after(30):
                await node.connect(PeerInfo(stranger, [multiaddr.Multiaddr(f"/ip4/{STRANGER_IP}/tcp/{target}")]))
        except Exception:  # noqa: BLE001 - the dial fails, as it should
            pass
        took = trio.current_time() - start
        nursery.cancel_scope.cancel()
    listener.close()
    for conn in kept:
        conn.close()
    return reads_where(remote_port=target), took


async def main() -> None:
    node = new_noise_host(create_new_key_pair(), [LOOPBACK])
    async with node.run([LOOPBACK]):
        for label, block in (("quiet loop", 0.0), ("busy loop (3 x 5 ms)", 0.005)):
            async with trio.open_nursery() as nursery:
                if block:
                    for _ in range(3):
                        nursery.start_soon(busy, block)
                for case in (in_handshake, after_handshake, mid_frame, outbound):
                    c0 = time.process_time()
                    reads, held = await case(node)
                    print(
                        f"{label:22s} {case.__name__:15s} node's empty reads {reads:4d}  "
                        f"{'slot held' if case is not outbound else 'dial took'} {held:6.3f} s after the close  "
                        f"(process CPU {time.process_time() - c0:.3f} s)"
                    )
                nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
