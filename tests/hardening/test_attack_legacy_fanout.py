"""ATTACK (h-attack2, on main c9a18d3): a fetching node forwards every message on the rollouts
topic to *every* established older release (older_releases.py `RolloutsForOlderReleases.publish`),
not to a mesh of D (6, at most D_high 12) as GossipSub does, and before any check of the intake.

Becoming an "established older release" costs a key one connection held 30 s, an identify without
`/sapo/groups/1`, and one group with signal the intake accepts every 10 minutes (any script that
runs reasoning-gym can make one: no model). With k such keys, each message one of them publishes
(within its author bucket: 50/s, bursts of 100) leaves the node k - 1 times: the fan-out is k, not
D. The payload can be one valid group frame repeated under fresh sequence numbers: the intake
refuses each repeat as `duplicate`, free, after the router has already sent it k - 1 times.
Each copy is a protobuf CopyFrom (send_rpc) queued per reader, 128 places each (pubsub_guards.py
OUTBOUND_QUEUE_SLOTS): up to 128 x 256 KiB = 32 MiB per reader that stops reading, times k.

Real py-libp2p on 127.0.0.1, k = 14 "older releases" (networks in gossip mode without the
`/sapo/groups/1` handler, as tests/protocol/test_older_releases.py builds them), the grace 0 s.

XFAIL(strict) on c9a18d3. Fixed: a fetching node sends only its own groups on the rollouts topic,
to at most MAX_READERS older releases, and skips a reader whose send queue is backed up
(older_releases.py): the 40 messages now leave the victim 0 times, and its own group reaches 8
readers, not 14; 8 stalled readers hold at most MAX_QUEUED of its groups each.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from functools import partial

import trio
from libp2p.peer.id import ID

from sapo.protocol.exchange import older_releases
from sapo.protocol.wire.group_wire import PROTOCOL_ID
from tests.support.gossip import TOPIC, receive_all, start_node

start_fetching = partial(start_node, exchange="fetch")
READERS = 14  # more than GossipSub's D_high (12)
MESSAGES = 40
SIZE = 60_000  # under yamux's 64 KB frame, to stay clear of that older issue


async def older_release(nursery, **kwargs):
    node = await start_node(nursery, exchange="gossip", discover_peers=0, **kwargs)
    node.service.host.remove_stream_handler(PROTOCOL_ID)
    return node


def ready(victim, old) -> bool:
    """The victim has identified `old`, and `old` sends its publishes to the victim: a hostile
    client sends to whom it likes, so past the victim's D_high its mesh is made to hold it."""
    victim_id = ID.from_base58(victim.service.peer_id)
    router = old.service.pubsub.router
    if victim_id in old.service.pubsub.peers:
        router.mesh.setdefault(TOPIC, set()).add(victim_id)
    return victim.service.older.is_older(ID.from_base58(old.service.peer_id)) and victim_id in router.mesh[TOPIC]


async def test_one_publish_is_not_sent_to_more_readers_than_a_mesh_would(monkeypatch):
    monkeypatch.setattr(older_releases, "LEGACY_AFTER_SECONDS", 0.0)
    with trio.fail_after(150):
        async with trio.open_nursery() as nursery:
            victim = await start_fetching(nursery, discover_peers=0, connections_high=200, connections_low=150)
            olds = [await older_release(nursery, peers=[victim.addr]) for _ in range(READERS)]
            with trio.fail_after(30):
                while len(victim.service.connected_peers()) < READERS:
                    await trio.sleep(0.1)
            await trio.sleep(3)  # subscriptions and mesh
            for old in olds:  # each key's one accepted group (the test plays the victim's intake)
                with trio.fail_after(30):
                    while not ready(victim, old):
                        await trio.sleep(0.2)
                assert await old.service.publish(f"valid group of {old.service.peer_id}".encode())
                [arrival] = await receive_all(victim, 1, timeout=20)
                victim.service.accepted(arrival)
            assert len(victim.service.legacy_peers()) == older_releases.MAX_READERS  # 14 heard, 8 read
            for old in olds[1:]:  # drain what the others forwarded so far
                while True:
                    try:
                        old.inbox.receive_nowait()
                    except trio.WouldBlock:
                        break

            author = olds[0]
            author.service.pubsub.router.spam_protection_enabled = False  # a hostile client ignores its own
            blob = b"x" * SIZE
            for i in range(MESSAGES):  # one burst, within the author's bucket at the victim (100)
                await author.service.publish(blob + i.to_bytes(4, "big"))
            assert await victim.service.share(b"the victim's own group", 0)
            await trio.sleep(8)
            received = []
            own = 0
            for old in olds[1:]:
                n = 0
                while True:
                    try:
                        message = old.inbox.receive_nowait()
                    except trio.WouldBlock:
                        break
                    n += message.sender == author.service.peer_id
                    own += message.sender == victim.service.peer_id
                received.append(n)
            copies = sum(received)
            print(
                f"{MESSAGES} messages of {SIZE} B from one key -> {copies} copies sent on by the victim to "
                f"{sum(1 for n in received if n)} readers: fan-out {copies / MESSAGES:.1f} "
                f"({copies * SIZE / 1e6:.1f} MB out for {MESSAGES * SIZE / 1e6:.1f} MB in)"
            )
            nursery.cancel_scope.cancel()
    assert copies == 0, f"the victim forwarded a stranger's messages {copies} times"
    assert 1 <= own <= older_releases.MAX_READERS


STALLED = 8
BIG = 200_000
BURST = 128  # one per place of each reader's outbound queue (pubsub_guards.OUTBOUND_QUEUE_SLOTS)


def queued_bytes(victim, readers: set[ID]) -> int:
    total = 0
    for peer, queue in victim.service.pubsub.peer_queues.items():
        if peer in readers:
            inner = queue._queue
            total += sum(rpc.ByteSize() for rpc in (*inner._non_priority, *inner._priority))
    return total


async def test_readers_that_stop_reading_do_not_hold_a_copy_of_every_message(monkeypatch):
    """k older releases (another process) are established, then stopped (SIGSTOP): their links
    stay open, nothing is read. One more older release publishes BURST messages of BIG bytes, at
    40/s (under its bucket), and the victim shares BURST groups of its own of BIG bytes. On
    c9a18d3 the victim kept a CopyFrom of each, per reader (204 MB for 8); now it forwards none of
    the stranger's, and holds at most MAX_QUEUED of its own per reader."""
    monkeypatch.setattr(older_releases, "LEGACY_AFTER_SECONDS", 0.0)
    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            victim = await start_fetching(nursery, discover_peers=0, connections_high=200, connections_low=150)
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.hardening.attack_stalled_readers", victim.addr, str(STALLED)],
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": "."},
            )
            try:
                for _ in range(STALLED):
                    [arrival] = await receive_all(victim, 1, timeout=90)
                    victim.service.accepted(arrival)
                line = await trio.to_thread.run_sync(proc.stdout.readline)
                assert line.strip() == b"ready"
                readers = {ID.from_base58(p) for p in victim.service.legacy_peers()}
                assert len(readers) == STALLED
                author = await older_release(nursery, peers=[victim.addr])
                with trio.fail_after(30):
                    while not ready(victim, author):
                        await trio.sleep(0.2)
                author.service.pubsub.router.spam_protection_enabled = False
                proc.send_signal(signal.SIGSTOP)
                peak = 0
                for i in range(BURST):
                    await author.service.publish(b"y" * BIG + i.to_bytes(4, "big"))
                    await victim.service.share(b"z" * BIG + i.to_bytes(4, "big"), i)
                    await trio.sleep(1 / 40)
                    peak = max(peak, queued_bytes(victim, readers))
                for _ in range(20):
                    await trio.sleep(0.25)
                    peak = max(peak, queued_bytes(victim, readers))
                held = queued_bytes(victim, readers)
                print(
                    f"{STALLED} stalled readers, {BURST} x {BIG} B published once ({BURST * BIG / 1e6:.1f} MB): "
                    f"the victim holds {held / 1e6:.1f} MB queued for them (peak {peak / 1e6:.1f} MB), "
                    f"{held / STALLED / 1e6:.1f} MB per reader; at the default --connections-high 96 that is "
                    f"~{held / STALLED * 96 / 1e9:.1f} GB"
                )
            finally:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            nursery.cancel_scope.cancel()
    bound = STALLED * older_releases.MAX_QUEUED * (BIG + 16_384)
    assert peak <= bound, f"{peak / 1e6:.1f} MB held for {STALLED} readers that read nothing"
