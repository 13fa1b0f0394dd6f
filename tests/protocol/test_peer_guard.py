"""The per-peer score and rate guard: its arithmetic on a fake clock, then a real flooder over
real libp2p hosts on 127.0.0.1 that ends up banned and disconnected while an honest peer's
messages keep arriving."""

import trio
from libp2p.crypto.ed25519 import create_new_key_pair

from sapo.protocol.peers.peer_guard import BAN_SCORE, PeerGuard
from tests.support.gossip import TOPIC, start_node, wait_for_mesh


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_burst_then_rate_then_dropped():
    clock = Clock()
    guard = PeerGuard(rate=2.0, burst=5, ban_seconds=60, clock=clock)
    assert [guard.admit(b"p") for _ in range(6)] == [None] * 5 + ["rate_limited"]
    clock.now += 1.0  # two tokens back
    assert [guard.admit(b"p") for _ in range(3)] == [None, None, "rate_limited"]
    assert guard.admit(b"other") is None  # buckets are per peer


def test_flooding_bans_and_the_ban_expires():
    clock = Clock()
    guard = PeerGuard(rate=10.0, burst=100, ban_seconds=30, clock=clock)
    banned_after = None
    for i in range(1000):  # 100x the rate: 1000 messages a second, numbered 1, 2, 3...
        clock.now += 0.001
        if guard.admit(b"flooder") == "rate_limited" and guard.is_banned(b"flooder"):
            banned_after = i
            break
    assert banned_after is not None and banned_after < 300, banned_after
    assert guard.is_banned(b"flooder") and guard.admit(b"flooder") == "banned"
    assert guard.banned() == [b"flooder"]
    assert not guard.penalize(b"flooder", "bad_schema")  # already banned: no second ban event
    clock.now += 30.0
    assert not guard.is_banned(b"flooder")
    assert guard.admit(b"flooder") is None and guard.score(b"flooder") == 0.0  # a clean slate


def test_sequence_numbers_count_publishes_that_never_arrived():
    """A flooder publishing 400/s of which the network delivers 1 in 10 (40/s, like an honest
    fast node) is still charged for 400/s; an honest 27/s node whose messages all arrive is not."""
    clock = Clock()
    guard = PeerGuard(rate=50.0, burst=100, ban_seconds=30, clock=clock)
    seqno = {b"flooder": 1_700_000_000, b"honest": 1_700_000_000}
    for step in range(400):  # 10 s
        clock.now += 0.025
        seqno[b"flooder"] += 10
        guard.admit(b"flooder", seqno[b"flooder"])
        if step % 3 == 0:  # ~13 a second, in bursts of 2 (tiny-model rounds)
            for _ in range(2):
                seqno[b"honest"] += 1
                assert guard.admit(b"honest", seqno[b"honest"]) is None
    assert guard.is_banned(b"flooder") and not guard.is_banned(b"honest")
    assert guard.score(b"honest") == 0.0
    # replays and reordering (lower numbers) cost one each, and one huge jump at most a bucket
    assert guard.admit(b"honest", seqno[b"honest"] - 5) is None
    clock.now += 10
    assert guard.admit(b"honest", 2**63) is None and not guard.is_banned(b"honest")


def test_what_others_forward_never_charges_its_author():
    """Framing by replay: with the guard's memory of an honest author flushed, someone forwards
    the author's old messages in an order full of gaps, as fast as it can. Sent by the author
    itself, that pace is a flood (charged, banned: the test above); forwarded by anyone else it
    is dropped once the author's bucket is empty, and the author is charged nothing."""
    clock = Clock()
    guard = PeerGuard(rate=50.0, burst=100, ban_seconds=30, clock=clock)
    seqno = 1_700_000_000
    verdicts = []
    for _ in range(2_000):  # 20 s of 100 replays a second, each 1,000 numbers past the last
        clock.now += 0.01
        seqno += 1_000
        verdicts.append(guard.admit(b"honest", seqno, direct=False))
    assert "rate_limited" in verdicts  # the bucket still bounds what goes on
    assert not guard.is_banned(b"honest") and guard.score(b"honest") == 0.0
    # the same pace from the author itself is charged as before
    for _ in range(2_000):
        clock.now += 0.01
        seqno += 1_000
        if guard.admit(b"honest", seqno) == "banned":
            break
    assert guard.is_banned(b"honest")


def test_score_recovers_so_rare_slips_never_ban():
    clock = Clock()
    guard = PeerGuard(rate=10.0, burst=100, ban_seconds=30, clock=clock)
    for _ in range(1000):  # one spoofed group every 20 s, for hours
        assert not guard.penalize(b"sloppy", "spoofed_answer_key")
        clock.now += 20.0
    assert guard.score(b"sloppy") == 0.0
    for _ in range(int(-BAN_SCORE / 10) - 1):  # but a quick run of junk does
        assert not guard.penalize(b"hostile", "bad_frame")
    assert guard.penalize(b"hostile", "bad_frame")


def test_honest_reasons_cost_nothing():
    guard = PeerGuard(rate=1.0, burst=1, ban_seconds=30, clock=Clock())
    for reason in ("duplicate", "stale", "unverifiable_version", "unknown_schema_version", "peer_quota"):
        for _ in range(1000):
            assert not guard.penalize(b"p", reason)
    assert guard.score(b"p") == 0.0


def test_groups_without_signal_never_sink_an_honest_peer_at_any_rate_it_may_publish():
    """A weak model's groups all score 0, a strong one's all 1: an honest node may send nothing
    else. At the rate limit (50/s, bursts of 100) for an hour, its score stays within a burst's
    charge (2 points) of 0 and never nears a ban; a slower node is back at 0 between rounds."""
    clock = Clock()
    guard = PeerGuard(rate=50.0, burst=100, ban_seconds=600, clock=clock)
    lowest = 0.0
    for _ in range(3600):  # a burst of 100 flat groups, then 50 a second, for an hour
        for _ in range(100 if clock.now == 1000.0 else 50):
            assert guard.admit(b"weak") is None
            assert not guard.penalize(b"weak", "no_signal")
            lowest = min(lowest, guard.score(b"weak"))
        clock.now += 1.0
    assert -2.0 - 1e-9 <= lowest < 0 and not guard.is_banned(b"weak")
    clock.now += 2.0
    assert guard.score(b"weak") == 0.0
    for _ in range(8):  # the untrained tiny model's round: a few flat groups, every half second
        guard.penalize(b"tiny", "no_signal")
    assert abs(guard.score(b"tiny") + 0.16) < 1e-9
    clock.now += 0.5
    assert guard.score(b"tiny") == 0.0


def test_tracking_is_bounded_and_keeps_bans():
    clock = Clock()
    guard = PeerGuard(rate=1.0, burst=1, ban_seconds=300, max_tracked=50, clock=clock)
    for _ in range(5):
        guard.penalize(b"banned", "malformed_frame")
    assert guard.is_banned(b"banned")
    for i in range(10_000):
        guard.admit(i.to_bytes(4, "big"))
    assert len(guard._peers) <= 50
    assert guard.is_banned(b"banned")


async def test_flooder_is_banned_and_disconnected_honest_peer_still_delivers():
    # All three hosts share this interpreter: on a busy machine the victim reads only ~15 of the
    # flooder's messages a second, so its limit is set low enough for that to be a flood.
    with trio.fail_after(55):
        async with trio.open_nursery() as nursery:
            # The ban outlasts the flooder's message cache (5 heartbeats): on reconnecting, a peer
            # replays that cache, and a cache full of flood would (rightly) get it banned again.
            # A star (no discovery): otherwise the honest peer also hears the flood directly and
            # keeps relaying its backlog to the victim after the ban, as a relay should.
            victim = await start_node(
                nursery, peer_message_rate=2.0, peer_message_burst=10, ban_seconds=7.0, discover_peers=0
            )
            flooder = await start_node(
                nursery,
                peers=[victim.addr],
                key_pair=create_new_key_pair(b"\x11" * 32),
                dial_backoff_initial=0.2,
                dial_backoff_max=0.5,
                discover_peers=0,
            )
            honest = await start_node(nursery, peers=[victim.addr], discover_peers=0)
            await wait_for_mesh([victim, flooder])
            await wait_for_mesh([victim, honest])
            flooder.service.pubsub.router.spam_protection_enabled = False  # a hostile client ignores its own
            flooder_id = flooder.service.peer_id

            started = trio.current_time()
            sent = 0
            while not victim.counters.get("peers_banned") and trio.current_time() - started < 25:
                for _ in range(10):  # up to 200 a second: 100x the victim's rate of 2
                    sent += bool(await flooder.service.publish(b"flood %d" % sent))
                await trio.sleep(0.05)
            time_to_ban = trio.current_time() - started
            assert victim.counters.get("peers_banned") == 1, victim.counters
            assert victim.service.status().bans == [flooder_id]
            assert victim.counters.get("rate_limited", 0) > 0
            assert time_to_ban < 25, time_to_ban

            with trio.fail_after(5):  # disconnected, and its redials are refused
                while flooder_id in victim.service.connected_peers():
                    await trio.sleep(0.05)
                while not victim.counters.get("banned"):
                    await trio.sleep(0.05)

            delivered = [message.sender for message in _drain(victim)]
            assert delivered.count(flooder_id) <= 10 + 2 * (time_to_ban + 1)  # the bucket, no more
            assert await honest.service.publish(b"honest after the flood")
            with trio.fail_after(5):
                message = await victim.inbox.receive()
            assert message.sender == honest.service.peer_id and message.data == b"honest after the flood"

            with trio.fail_after(10):  # the 7 s ban expires...
                while victim.service.status().bans:
                    await trio.sleep(0.1)
            with trio.fail_after(15):  # ...the bootstrap keeper gets back in, and it may speak again
                while not any(m.sender == flooder_id and m.data == b"back" for m in _drain(victim)):
                    await flooder.service.publish(b"back")
                    await trio.sleep(0.3)
            print(f"\nflooder: {sent} sent, banned after {time_to_ban:.2f} s; victim counters {victim.counters}")
            nursery.cancel_scope.cancel()


def _drain(node):
    out = []
    while True:
        try:
            out.append(node.inbox.receive_nowait())
        except trio.WouldBlock:
            return out


async def test_bootstrap_keeper_does_not_redial_a_banned_peer():
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            target = await start_node(nursery, discover_peers=0)
            node = await start_node(
                nursery, peers=[target.addr], ban_seconds=60, dial_backoff_initial=0.2, discover_peers=0
            )
            await wait_for_mesh([node, target])
            await trio.sleep(1)  # the keeper's own dial has returned
            failed_before = node.counters.get("dial_failed", 0)
            for _ in range(3):
                node.service.gate.penalize(target.service.my_id, "malformed_frame")
            assert node.counters["peers_banned"] == 1
            with trio.fail_after(5):
                while target.service.peer_id in node.service.connected_peers():
                    await trio.sleep(0.05)
            await trio.sleep(2)  # several keeper periods
            assert target.service.peer_id not in node.service.connected_peers()
            assert node.counters.get("dial_failed", 0) == failed_before  # not even tried
            assert TOPIC in node.service.pubsub.topic_ids
            nursery.cancel_scope.cancel()
