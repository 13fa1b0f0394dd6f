"""ATTACK (h-atk5, on h-crowd c2f0023): one address that opens TCP connections and never says a
word holds every inbound slot, and no newcomer gets in.

py-libp2p 0.8.1 takes an inbound slot (250 of them) for each TCP connection before reading a
byte (swarm.py `_handle_inbound_connection`), and gives it back when the handshake fails, after
`inbound_upgrade_timeout` (10 s). Nothing caps the slots one address holds while handshaking:
the connection gate and rcmgr come later or key on a peer id that a silent connection never
names, and the connection manager sees only upgraded links. So 250 silent connections, each
opened again when the node closes it, are about 25 TCP connects a second from one address, with
no key and no cryptography, and every newcomer is closed before its first byte. 0.8.1 had the
same hole (it was hidden behind its worse one: every slot kept for the node's life);
protocol/toolkit/inbound.py gives slots back when links close, so this is now the cheapest way
to make a node refuse newcomers: a seed under it lets nobody join.

Real py-libp2p on 127.0.0.1 with the library's own 250 slots.
XFAIL(strict) on c2f0023: what a fix must make true is that newcomers get in while it goes on.
"""

from __future__ import annotations

import multiaddr
import trio

from tests.hardening.zombie_links import census, newcomer_gets_in, silent_connection
from tests.support.gossip import start_node

SILENT = 250  # the library's slots, from one address


async def test_silent_connections_from_one_address_do_not_keep_newcomers_out():
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            victim = await start_node(nursery, discover_peers=0)
            port = int(multiaddr.Multiaddr(victim.addr).value_for_protocol("tcp"))
            opened = [0]
            for _ in range(SILENT):
                nursery.start_soon(silent_connection, port, opened)
            await trio.sleep(2)
            held = census(victim.service.host)
            tries = got_in = 0
            start = trio.current_time()
            while trio.current_time() - start < 15:  # past one upgrade timeout: slots did come back
                tries += 1
                got_in += await newcomer_gets_in(victim.addr)
                await trio.sleep(1)
            print(f"slots held {held['slots']}; newcomers in {got_in} of {tries}; silent connections {opened[0]}")
            nursery.cancel_scope.cancel()
    assert got_in >= tries - 1
