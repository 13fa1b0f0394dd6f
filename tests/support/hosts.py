"""Plain py-libp2p hosts (Noise, no pubsub) on 127.0.0.1, run as tasks of the test's nursery."""

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr

from sapo.protocol.toolkit.hosts import new_noise_host

LOOPBACK = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")


async def two_connected_hosts(nursery):
    """(server, client): two listening hosts, the client connected to the server."""
    hosts = [new_noise_host(create_new_key_pair(), [LOOPBACK]) for _ in range(2)]
    for host in hosts:
        await nursery.start(run_host, host)
    server, client = hosts
    await client.connect(info_from_p2p_addr(server.get_addrs()[0]))
    return server, client


async def run_host(host, *, task_status=trio.TASK_STATUS_IGNORED):
    """Run `host` until the nursery is cancelled, then close it (shielded, at most 2 s)."""
    async with host.run([LOOPBACK]):
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with trio.move_on_after(2) as scope:
                scope.shield = True
                await host.close()
