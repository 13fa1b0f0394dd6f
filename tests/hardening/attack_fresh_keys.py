"""Helper process for test_attack3_own_key_evicted.py: `count` fresh keys, `parallel` at a time,
each connects to a victim once (Noise, yamux, identify: what any libp2p peer does) and leaves.
Prints "done <connected> <seconds>".

    python -m tests.hardening.attack_fresh_keys <victim multiaddr> <count> <parallel>
"""

from __future__ import annotations

import sys
import time

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr

from sapo.protocol.toolkit.hosts import new_noise_host

LISTEN = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")


async def main(victim: str, count: int, parallel: int) -> None:
    info = info_from_p2p_addr(multiaddr.Multiaddr(victim))
    started = time.monotonic()
    connected = [0]
    limiter = trio.CapacityLimiter(parallel)

    async def one() -> None:
        async with limiter:
            host = new_noise_host(create_new_key_pair(), [LISTEN])
            async with host.run([LISTEN]):
                with trio.move_on_after(10):
                    try:
                        await host.connect(info)
                        connected[0] += 1
                        await trio.sleep(0.3)  # identify runs both ways
                    except Exception:  # noqa: BLE001 - refused: the next key
                        pass
                with trio.move_on_after(1.0):
                    await host.close()

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    print(f"done {connected[0]} {time.monotonic() - started:.1f}", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
