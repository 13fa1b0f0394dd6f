"""ATTACK (h-atk10, on 014380f): what a connection costs a real node (tests/support/gossip.py
`start_node`, on 127.0.0.1) against what it costs the stranger, in CPU seconds, for

  tcp        a TCP connection from 127.0.0.2 that ends (FIN) at once: no key, no cryptography.
             The room's cheapest connection (accept, gate, admit, one read, cleanup, close).
  link       a fresh key's full Noise + yamux handshake (a py-libp2p host), then a FIN: the node's
             link read loop reads the ended stream 101 times (0.8.1's `read_exactly`)
  link-mid   the same, the last bytes a yamux DATA frame cut short: 202 reads

The node's CPU is this process's (time.process_time over the flood, less its idle rate); the
stranger's is its own process's. ATTACK10_FIX=1 patches the suggested fix (the first empty read
of a TCP stream is its end, for the link's whole life too) into the node's process only;
ATTACK10_REFUSE=1 makes the node close every inbound connection before its handshake (what a
per-place rate limit's refusal would cost: the floor of the `tcp` row).

Run: .venv/bin/python -m tests.hardening.attack10_cost [tcp|link|link-mid ...]   (about 30 s)
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time

import multiaddr
import trio

STRANGER_IP = "127.0.0.2"
COUNTS = {"tcp": 400, "link": 40, "link-mid": 40}


# ---- the stranger (a subprocess) -------------------------------------------------------------


def tcp_flood(host: str, port: int, n: int) -> None:
    c0 = time.process_time()
    for _ in range(n):
        s = socket.socket()
        s.bind((STRANGER_IP, 0))
        s.connect((host, port))
        s.shutdown(socket.SHUT_WR)  # a FIN; what the node says is read, so no RST
        s.settimeout(5)
        try:
            while s.recv(65536):
                pass
        except OSError:
            pass
        s.close()
    print(f"stranger_cpu {time.process_time() - c0:.4f} {n}")


async def link_flood(address: str, n: int, mid: bool) -> None:
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.stream_muxer.yamux.yamux import FLAG_SYN, TYPE_DATA, YAMUX_HEADER_FORMAT

    from sapo.protocol.toolkit.hosts import new_noise_host

    info = info_from_p2p_addr(multiaddr.Multiaddr(address))
    spent, done = 0.0, 0
    for _ in range(n):
        host = new_noise_host(create_new_key_pair(), [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")])
        async with host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            c0 = time.process_time()
            try:
                with trio.fail_after(10):
                    await host.connect(info)
                    for connection in host.get_network().get_connections(info.peer_id):
                        if mid:
                            header = struct.pack(YAMUX_HEADER_FORMAT, 0, TYPE_DATA, FLAG_SYN, 101, 1000)
                            await connection.muxed_conn.secured_conn.write(header + b"x" * 10)
                        tcp = connection.muxed_conn.secured_conn.conn.read_writer.read_write_closer.stream.stream
                        tcp.socket.shutdown(trio.socket.SHUT_WR)
                    while any(not c.is_closed for c in host.get_network().get_connections(info.peer_id)):
                        await trio.sleep(0.005)
                done += 1
            except Exception as error:  # noqa: BLE001
                print(f"link failed: {error!r}", file=sys.stderr)
            spent += time.process_time() - c0
            await host.close()
    print(f"stranger_cpu {spent:.4f} {done}")


# ---- the node (this process) -----------------------------------------------------------------


async def measure(modes: list[str]) -> None:
    if os.environ.get("ATTACK10_FIX"):
        from sapo.protocol.toolkit.inbound import HandshakeConnection

        HandshakeConnection.handshaking = property(lambda self: True, lambda self, value: None)  # type: ignore[assignment]
    if os.environ.get("ATTACK10_REFUSE"):
        from sapo.protocol.toolkit import inbound

        async def refuse(swarm, room, library_handler, stream, maddr, failure_event):  # type: ignore[no-untyped-def]
            await inbound._close_quietly(stream)

        inbound._handle_until_closed = refuse  # type: ignore[assignment]
    from tests.support.gossip import start_node

    async with trio.open_nursery() as nursery:
        node = await start_node(nursery, discover_peers=0)
        address = f"{node.addr}/p2p/{node.service.peer_id}" if "/p2p/" not in node.addr else node.addr
        port = int(multiaddr.Multiaddr(node.addr).value_for_protocol("tcp"))
        await trio.sleep(2)
        c0, w0 = time.process_time(), trio.current_time()
        await trio.sleep(3)
        idle = (time.process_time() - c0) / (trio.current_time() - w0)
        for mode in modes:
            n = COUNTS[mode]
            args = [
                sys.executable,
                "-m",
                "tests.hardening.attack10_cost",
                "--stranger",
                mode,
                address,
                str(port),
                str(n),
            ]
            c0, w0 = time.process_time(), trio.current_time()
            result = await trio.run_process(args, capture_stdout=True, capture_stderr=True, check=False)
            wall = trio.current_time() - w0
            await trio.sleep(1)  # what the node still does after the last one
            node_cpu = time.process_time() - c0 - idle * (wall + 1)
            line = [x for x in result.stdout.decode().splitlines() if x.startswith("stranger_cpu")]
            if not line:
                print(mode, "stranger failed:", result.stderr.decode()[-2000:])
                continue
            _, stranger_cpu, done = line[0].split()
            done_n = max(1, int(done))
            print(
                f"{mode:9s} {'refuse' if os.environ.get('ATTACK10_REFUSE') else 'fix' if os.environ.get('ATTACK10_FIX') else '014380f'}: {done_n} connections in "
                f"{wall:.1f} s; node {node_cpu / done_n * 1e3:.2f} ms CPU each, stranger "
                f"{float(stranger_cpu) / done_n * 1e3:.2f} ms each (ratio {node_cpu / max(float(stranger_cpu), 1e-9):.1f})"
            )
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--stranger":
        mode, address, port, n = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        if mode == "tcp":
            tcp_flood("127.0.0.1", port, n)
        else:
            trio.run(link_flood, address, n, mode == "link-mid")
    else:
        trio.run(measure, sys.argv[1:] or ["tcp", "link", "link-mid"])
