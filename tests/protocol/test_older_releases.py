"""Older releases in a fetching swarm (protocol/exchange/older_releases.py): real py-libp2p hosts
on 127.0.0.1. An "older release" here is a network in gossip mode whose `/sapo/groups/1` handler is
removed, so that identify says what 0.3.0's says: gossip, and no group fetching.

Our groups go on the rollouts topic only for an older release that has stayed and whose own
group our intake accepted (the test plays the exchange, which says so through `accepted`), and
only to it: another node of this release, in the same mesh, receives none of them. A stranger
that says it cannot fetch and publishes nothing gets nothing, however long it stays; a group
pushed on the topic by a node of this release is refused unasked."""

from functools import partial

import trio

from sapo.protocol.exchange import older_releases
from sapo.protocol.wire.group_wire import PROTOCOL_ID
from tests.support.gossip import assert_empty, receive_all, start_node, wait_for_mesh

start_fetching = partial(start_node, exchange="fetch")  # the node's default: groups are asked for
STAY_SECONDS = 2.0  # LEGACY_AFTER_SECONDS is 30 s in a node: the rule, not the wait


async def older_release(nursery, **kwargs):
    node = await start_node(nursery, exchange="gossip", **kwargs)  # reads every group on the topic
    node.service.host.remove_stream_handler(PROTOCOL_ID)  # and cannot serve any
    return node


async def connected(node, other) -> None:
    with trio.fail_after(10):
        while other.service.peer_id not in node.service.connected_peers():
            await trio.sleep(0.05)


async def heard(node, older) -> None:
    """`older` publishes a group; `node`'s intake accepts it (the exchange tells the network)."""
    assert await older.service.publish(b"the old one's")
    [arrival] = await receive_all(node, 1)
    assert (arrival.route, arrival.sender, arrival.data) == ("gossip", older.service.peer_id, b"the old one's")
    node.service.accepted(arrival)


async def test_groups_go_on_the_topic_for_an_older_release_that_stayed_and_was_heard(monkeypatch):
    monkeypatch.setattr(older_releases, "LEGACY_AFTER_SECONDS", STAY_SECONDS)
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            old = await older_release(nursery)
            new = await start_fetching(nursery, peers=[old.addr])
            await connected(new, old)
            await wait_for_mesh([new, old])
            assert new.service.legacy_peers() == []  # just connected
            await trio.sleep(STAY_SECONDS + 0.5)
            assert new.service.legacy_peers() == []  # stayed, but nothing of its own was accepted
            assert await new.service.share(b"too soon", 0)
            assert new.counters.get("published", 0) == 0

            await heard(new, old)
            assert new.service.legacy_peers() == [old.service.peer_id]
            assert await new.service.share(b"for the old one", 1)
            [message] = await receive_all(old, 1)
            assert message.route == "gossip"  # on the topic: the old release cannot fetch
            assert message.data == b"for the old one" and message.sender == new.service.peer_id
            assert new.counters["published"] == 1
            nursery.cancel_scope.cancel()


async def test_the_topic_carries_our_groups_to_older_releases_only(monkeypatch):
    """A line: an older release, a node of this release that heard it, and another node of this
    release connected only to that one, all three with discovery off. The middle node shares a
    group: the older release gets it on the topic; the other node, in the middle node's mesh,
    gets no copy at all, not even one to refuse, nor an offer of one (IHAVE) over the next
    heartbeats, and fetches the group instead. (An older release forwards what it reads to its
    own mesh, as 0.3.0 does; that is why the line.)"""
    monkeypatch.setattr(older_releases, "LEGACY_AFTER_SECONDS", 0.0)
    alone = {"discover_peers": 0}
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            old = await older_release(nursery, **alone)
            new = await start_fetching(nursery, peers=[old.addr], **alone)
            other = await start_fetching(nursery, peers=[new.addr], **alone)
            await connected(new, old)
            await connected(other, new)
            await wait_for_mesh([new, old])
            await wait_for_mesh([new, other])
            await heard(new, old)

            assert await new.service.share(b"ours", 0)
            [at_old] = await receive_all(old, 1)
            assert (at_old.route, at_old.data) == ("gossip", b"ours")
            await trio.sleep(2.5)  # a few heartbeats: no IHAVE offers it either
            assert_empty(other)
            assert other.counters.get("pushed_refused", 0) == 0  # it never came
            assert other.counters.get("received", 0) == 0
            assert old.service.peer_id not in other.service.connected_peers()
            other.service.want(2)
            [fetched] = await receive_all(other, 1)
            assert (fetched.route, fetched.sender, fetched.data) == ("fetch", new.service.peer_id, b"ours")
            nursery.cancel_scope.cancel()


async def test_a_stranger_that_says_it_cannot_fetch_gets_nothing_until_it_publishes(monkeypatch):
    monkeypatch.setattr(older_releases, "LEGACY_AFTER_SECONDS", 0.0)
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            stranger = await older_release(nursery)
            new = await start_fetching(nursery, peers=[stranger.addr])
            await connected(new, stranger)
            await wait_for_mesh([new, stranger])
            for round_index in range(5):
                assert await new.service.share(b"a group", round_index)
                await trio.sleep(0.2)
            assert new.counters.get("published", 0) == 0 and new.service.legacy_peers() == []
            assert_empty(stranger)
            nursery.cancel_scope.cancel()


async def test_a_group_pushed_on_the_topic_by_this_release_is_refused_unasked():
    """A node of this release that gossips (it has `/sapo/groups/1`, so it is no older release)
    pushes a group: a fetching node refuses it before any check and keeps nothing of its author
    (fresh keys' pushes cannot flush the memory kept of the authors it does hear), and the
    author, whose copy came by the topic, is still drawn for fetching."""
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            pusher = await start_node(nursery, exchange="gossip")
            node = await start_fetching(nursery, peers=[pusher.addr])
            await connected(node, pusher)
            await wait_for_mesh([node, pusher])
            assert await pusher.service.publish(b"pushed")
            with trio.fail_after(5):
                while not node.counters.get("pushed_refused"):
                    await trio.sleep(0.05)
            assert_empty(node)
            assert pusher.service.my_id.to_bytes() not in node.service.policy.guard._peers
            assert pusher.service.my_id in {author.peer_id for author in node.service.fetcher.authors()}
            nursery.cancel_scope.cancel()
