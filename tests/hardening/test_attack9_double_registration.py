"""ATTACK (h-atk9, on main fc3736e): two opens of our pubsub stream to one peer at once register
it twice, and the first registration's sender task outlives the link, for good.

py-libp2p 0.8.1's `Pubsub._handle_new_peer` (libp2p/pubsub/pubsub.py:890-985) checks
`peer_id in self.peers` once, before its awaits (`host.new_stream`, the hello write), and then
overwrites `self.peers[peer_id]` and `self.peer_queues[peer_id]` without closing what was there.
Two opens that overlap both pass the check: the first queue is dropped unclosed, and its
`handle_sending_messages` task waits on it for ever (nothing can reach it once it is not in
`peer_queues`; the dead-peer path closes only the queue it finds there), with its stream, for as
long as the node runs. Each one is a root task that `TrioManager.run_task` walks for every task
it starts later (every inbound message's `push_msg`: see test_attack3_rpc_task_storm.py).

Who opens at once: the library itself for each new connection's `connected` notifee
(`handle_peer_queue` -> `_handle_new_peer_with_retry`, with no timeout, and not in
`_peer_stream_retries_pending`), its dead-peer retry, and since 595f217 our
protocol/reach/pubsub_streams.py, whose `pending` check cannot see the notifee's opens. A peer
decides when its side answers our stream's negotiation (up to the host's 10 s), so it can hold
our reopen's stream, open a second connection to us, and answer both: a double registration
whenever it likes. Measured on 2 loopback nodes (this setup): reopen alone leaves 0
sender tasks once the link ends; reopen + one notifee open at once leaves 1; two notifee opens
at once (no reopen at all) leave 1 too.

It failed (strict xfail) on fc3736e; h-atk9's proposed patch (one open per peer at a time, in
GuardedPubsub._handle_new_peer) makes it pass.
"""

from __future__ import annotations

import trio
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from sapo.protocol.reach import pubsub_streams
from sapo.protocol.toolkit.hosts import cut_connections, open_peers
from tests.support.gossip import start_node


def live_senders(pubsub, peer) -> int:
    """`handle_sending_messages` tasks for `peer` still running in pubsub's task manager."""

    def walk(tasks):
        for task in tasks:
            yield task
            yield from walk(getattr(task, "children", ()))

    return sum(
        1
        for task in walk(pubsub.manager._root_tasks)
        if "handle_sending_messages" in str(getattr(task, "name", ""))
        and peer in getattr(task, "_async_fn_args", ())
        and not task.is_done
    )


async def test_a_reopen_beside_the_librarys_own_open_leaves_no_sender_once_the_link_ends(monkeypatch):
    monkeypatch.setattr(pubsub_streams, "MIN_LINK_SECONDS", 0.0)
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery)
            b = await start_node(nursery)
            await a.service.host.connect(info_from_p2p_addr(Multiaddr(str(b.addr))))  # nobody dials it back
            b_id, pubsub = b.service.my_id, a.service.pubsub
            streams = pubsub_streams.PubsubStreams(a.service.host, pubsub, a.service.gate)
            await pubsub.wait_for_peer(b_id, timeout=10)
            while b_id not in a.service.host._identified_peers:  # identify lists gossip for b
                await trio.sleep(0.05)

            # Our stream to b dies while b refuses a new one, so the library's own retry gives up
            # and the link stays deaf: the case the loop exists for.
            b.service.host.remove_stream_handler(streams.protocol)
            await pubsub.peers[b_id].reset()
            pubsub._handle_dead_peer(b_id)  # what our sender does when its next write fails
            while b_id in pubsub._peer_stream_retries_pending:
                await trio.sleep(0.05)
            b.service.host.set_stream_handler(streams.protocol, b.service.pubsub.stream_handler)
            assert b_id not in pubsub.peers and live_senders(pubsub, b_id) == 0

            # b opens a second connection as our pass starts: its `connected` notifee makes the
            # library open our stream too (handle_peer_queue's task, run the same way).
            pubsub.manager.run_task(pubsub._handle_new_peer_with_retry, b_id)
            assert await streams.reopen() == 1
            await trio.sleep(1.0)

            await cut_connections(a.service.host, b_id)  # the link ends
            with trio.fail_after(10):
                while b_id in open_peers(a.service.host) or b_id in pubsub.peers:
                    await trio.sleep(0.1)
            await trio.sleep(1.0)
            assert live_senders(pubsub, b_id) == 0  # 1 on fc3736e: it waits on a queue nobody holds
            nursery.cancel_scope.cancel()
