"""Groups are fetched, not flooded (`/sapo/groups/1`): real py-libp2p hosts on 127.0.0.1.

A node's groups reach a peer that asks, from its outbox, once each; they do not go on the topic
unless an older release is connected; an author the asker knows only from discovery is dialled;
frames are bounded before they are read, and a peer that asks too often is refused."""

import time
from functools import partial

import msgpack
import pytest
import trio
from libp2p.peer.id import ID

from sapo.protocol.exchange import group_fetch
from sapo.protocol.exchange.group_fetch import GROUPS_PER_AUTHOR, SERVE_BURST
from sapo.protocol.toolkit.loop_lag import BEHIND_SECONDS
from sapo.protocol.wire.group_wire import (
    MAX_GROUPS_PER_RESPONSE,
    PROTOCOL_ID,
    BadFrame,
    GroupRequest,
    Outbox,
    ServedGroup,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from tests.support.gossip import receive_all, start_node

start_fetching = partial(start_node, exchange="fetch")  # the node's default: groups are asked for

# --- the wire ------------------------------------------------------------------------------------


def payload(frame: bytes) -> bytes:
    return frame[4:]  # past the length header


def test_a_request_and_a_response_round_trip():
    request = GroupRequest("test", after=3, max_groups=2)
    assert decode_request(payload(encode_request(request))) == request
    groups = [ServedGroup(5, b"five"), ServedGroup(4, b"four")]
    assert decode_response(payload(encode_response(groups)), request, 1024) == groups


@pytest.mark.parametrize(
    "body, why",
    [
        ({"v": 1, "swarm": "s", "after": -2, "max": 1}, "round number"),
        ({"v": 1, "swarm": "s", "after": 0, "max": MAX_GROUPS_PER_RESPONSE + 1}, "'max'"),
        ({"v": 1, "swarm": "s", "after": True, "max": 1}, "round number"),
        ({"v": 1, "after": 0, "max": 1}, "'swarm'"),
        ({"v": 2, "swarm": "s", "after": 0, "max": 1}, "version"),
        ({"v": 1, "swarm": "s", "after": 0, "max": 1, "x": b"\0" * 300}, "bounded"),
    ],
)
def test_bad_requests_are_refused(body, why):
    with pytest.raises(BadFrame, match=why):
        decode_request(msgpack.packb(body, use_bin_type=True))


def test_a_response_holds_no_more_than_was_asked_for():
    request = GroupRequest("test", after=3, max_groups=1)
    two = encode_response([ServedGroup(5, b"a"), ServedGroup(6, b"b")])
    with pytest.raises(BadFrame):
        decode_response(payload(two), request, 1024)
    old = encode_response([ServedGroup(3, b"a")])  # a round the asker already has
    with pytest.raises(BadFrame, match="not asked for"):
        decode_response(payload(old), request, 1024)
    big = encode_response([ServedGroup(4, b"x" * 2000)])  # over the asker's size limit
    with pytest.raises(BadFrame):
        decode_response(payload(big), request, 1024)


def test_the_outbox_serves_the_newest_groups_after_the_askers_round():
    outbox = Outbox(capacity=4)
    for round_index in range(6):
        outbox.put(round_index, f"g{round_index}".encode())
    assert len(outbox) == 4  # rounds 0 and 1 made way
    newest = outbox.newer_than(GroupRequest("test", after=2, max_groups=2))
    assert [g.round_index for g in newest] == [5, 4]
    assert outbox.newer_than(GroupRequest("test", after=5, max_groups=4)) == []
    assert [g.round_index for g in outbox.newer_than(GroupRequest("test", after=-1, max_groups=4))] == [5, 4, 3, 2]


# --- real hosts ----------------------------------------------------------------------------------


async def connected(node, other) -> None:
    with trio.fail_after(10):
        while other.service.peer_id not in node.service.connected_peers():
            await trio.sleep(0.05)


async def test_an_asked_for_group_arrives_once_from_its_author_and_never_on_the_topic():
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            author = await start_fetching(nursery)
            asker = await start_fetching(nursery, peers=[author.addr])
            await connected(asker, author)
            for round_index in range(3):
                assert await author.service.share(f"group {round_index}".encode(), round_index)
            assert author.counters.get("published", 0) == 0  # no older release connected: nothing on the topic

            asker.service.want(2)
            received = await receive_all(asker, 2)
            assert [(m.route, m.topic) for m in received] == [("fetch", None)] * 2  # not a gossip message
            assert [m.data for m in received] == [b"group 2", b"group 1"]
            assert {m.sender for m in received} == {author.service.peer_id}

            assert await author.service.share(b"group 3", 3)
            asker.service.want(4)  # only what is newer than what it has: round 3, not rounds 0-2 again
            [newest] = await receive_all(asker, 1)
            assert newest.data == b"group 3"
            await trio.sleep(0.5)
            assert asker.counters["fetch_groups"] == 3 and author.counters["fetch_served"] >= 2
            with pytest.raises(trio.WouldBlock):
                asker.inbox.receive_nowait()
            nursery.cancel_scope.cancel()


async def test_each_drawn_author_is_asked_for_two_groups_so_a_want_costs_half_the_requests():
    assert GROUPS_PER_AUTHOR == 2
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            authors = [await start_fetching(nursery) for _ in range(4)]
            asker = await start_fetching(nursery, peers=[a.addr for a in authors])
            for index, author in enumerate(authors):
                await connected(asker, author)
                for round_index in range(2):
                    assert await author.service.share(f"author {index} round {round_index}".encode(), round_index)

            asker.service.want(4)
            received = await receive_all(asker, 4)
            by_author: dict[str, list[bytes]] = {}
            for message in received:
                by_author.setdefault(message.sender, []).append(message.data)
            assert sorted(len(groups) for groups in by_author.values()) == [2, 2]  # two authors, two groups each
            assert asker.counters["fetch_requests"] == 2
            nursery.cancel_scope.cancel()


async def test_a_request_that_comes_before_the_group_is_answered_when_it_is_published():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            author = await start_fetching(nursery)
            asker = await start_fetching(nursery, peers=[author.addr])
            await connected(asker, author)
            asker.service.want(1)
            with trio.fail_after(5):
                while not asker.counters.get("fetch_requests"):
                    await trio.sleep(0.01)
            await trio.sleep(0.3)  # the request is at the author, which has nothing yet
            assert await author.service.share(b"just published", 0)
            [message] = await receive_all(asker, 1)
            assert message.data == b"just published"
            assert asker.counters["fetch_requests"] == 1  # the held request brought it: no second ask
            nursery.cancel_scope.cancel()


async def dial_no_one() -> None:
    return


async def far_author(nursery, hub_handler=None):
    """A hub, an author that shared "from afar", and an asker that knows that author from
    discovery only: both stay connected to the hub alone.
    `hub_handler` replaces the hub's `/sapo/groups/1` handler."""
    hub = await start_fetching(nursery)
    if hub_handler is not None:
        hub.service.host.set_stream_handler(PROTOCOL_ID, hub_handler)
    # Discovery dials until a node has dialled `discover_peers` peers besides its seeds (so that
    # it can let them go), and here each would dial the other: their discovery learns but does
    # not dial, so that only the asker's fetcher can link them.
    far = await start_fetching(nursery, peers=[hub.addr], discover_peers=1, discovery_interval_seconds=0.5)
    far.service.discovery.dial_some = dial_no_one
    asker = await start_fetching(nursery, peers=[hub.addr], discover_peers=1, discovery_interval_seconds=0.5)
    asker.service.discovery.dial_some = dial_no_one
    assert await far.service.share(b"from afar", 0)
    with trio.fail_after(20):
        while far.service.my_id not in {e.peer_id for e in asker.service.discovery.known()}:
            await trio.sleep(0.1)
    await connected(asker, hub)
    assert far.service.peer_id not in asker.service.connected_peers()
    return hub, far, asker


async def test_an_author_known_only_from_discovery_is_dialled_and_asked():
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            _, far, asker = await far_author(nursery)
            got = []
            with trio.fail_after(20):
                while not got:
                    asker.service.want(2)
                    with trio.move_on_after(1.0):
                        got.append(await asker.inbox.receive())
            assert (got[0].route, got[0].sender, got[0].data) == ("fetch", far.service.peer_id, b"from afar")
            assert asker.counters["fetch_dials"] >= 1
            nursery.cancel_scope.cancel()


async def stall(stream) -> None:
    """A `/sapo/groups/1` handler that takes the request and never answers."""
    await trio.sleep_forever()


async def test_an_author_that_holds_its_stream_fails_alone_and_a_node_with_an_idle_loop_still_dials():
    """Holding a request open used to trip an overload breaker: no dials for 10 s, and the pass
    ended. Now it costs the holder its place in the draw, and nothing else: the breaker is the
    node's own loop lag, and the loop here is idle."""
    asks: list[tuple[str, ID]] = []  # (author, asker) in the order the requests came

    async def stall_noting(stream) -> None:
        asks.append(("hub", stream.muxed_conn.peer_id))
        await stall(stream)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            _, far, asker = await far_author(nursery, hub_handler=stall_noting)
            serve = far.service.host.multiselect.handlers[PROTOCOL_ID]

            async def serve_noting(stream) -> None:
                asks.append(("far", stream.muxed_conn.peer_id))
                await serve(stream)

            far.service.host.set_stream_handler(PROTOCOL_ID, serve_noting)
            fetcher = asker.service.fetcher
            started = trio.current_time()
            # the hub, the one author linked, holds the request; the far one would need a dial
            assert await fetcher.fetch(2, 0, nursery) == (0, 0)
            with trio.fail_after(group_fetch.AUTHOR_SECONDS + 5):
                while not asker.counters.get("fetch_timeouts"):
                    await trio.sleep(0.05)
            assert trio.current_time() - started < group_fetch.AUTHOR_SECONDS + 2  # its deadline, no more
            assert not fetcher.loop_lag.behind() and "fetch_calm" not in asker.counters
            # so the next pass dials the far author first, the hub (it failed us) at the back
            got = []
            with trio.fail_after(10):
                while not got:
                    await fetcher.fetch(2, 2, nursery)
                    with trio.move_on_after(1.0):
                        got.append(await asker.inbox.receive())
            assert (got[0].sender, got[0].data) == (far.service.peer_id, b"from afar")
            by_asker = [author for author, who in asks if who == asker.service.host.get_id()]
            # the hub's one request, then the far author's; the hub again only behind it, for the
            # group the far author did not have
            assert by_asker[:2] == ["hub", "far"] and by_asker[2:] in ([], ["hub"]), by_asker
            nursery.cancel_scope.cancel()


async def test_while_the_nodes_own_loop_is_behind_a_fetch_dials_no_one():
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            _, far, asker = await far_author(nursery)
            fetcher = asker.service.fetcher
            time.sleep(0.8)  # noqa: ASYNC251 - on purpose: the whole loop stalls, as a node starved of CPU does
            with trio.fail_after(2):
                while not fetcher.loop_lag.behind():
                    await trio.sleep(0.05)
            assert fetcher.loop_lag.worst >= BEHIND_SECONDS
            await fetcher.fetch(2, 2, nursery)
            assert asker.counters["fetch_calm"] == 1 and "fetch_dials" not in asker.counters
            assert far.service.peer_id not in asker.service.connected_peers()
            nursery.cancel_scope.cancel()


async def test_a_node_of_another_swarm_gets_no_groups():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            author = await start_fetching(nursery)
            stranger = await start_fetching(nursery, peers=[author.addr], swarm="elsewhere")
            await connected(stranger, author)
            assert await author.service.share(b"ours only", 0)
            stranger.service.want(2)
            with trio.fail_after(10):
                while not author.counters.get("fetch_served"):
                    await trio.sleep(0.05)
            await trio.sleep(0.3)
            with pytest.raises(trio.WouldBlock):
                stranger.inbox.receive_nowait()
            nursery.cancel_scope.cancel()


async def test_a_peer_that_asks_too_often_is_refused():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            author = await start_fetching(nursery)
            asker = await start_fetching(nursery, peers=[author.addr])
            await connected(asker, author)
            assert await author.service.share(b"one group", 0)  # something to answer with at once
            host, peer = asker.service.host, author.service.my_id
            answered = 0
            for _ in range(SERVE_BURST + 4):
                try:
                    stream = await host.new_stream(peer, [PROTOCOL_ID])
                    await stream.write(encode_request(GroupRequest("test", after=-1, max_groups=1)))
                    answered += bool(await stream.read(4))
                except Exception:  # noqa: BLE001 - a refused request is a reset stream
                    pass
            assert SERVE_BURST <= answered < SERVE_BURST + 4
            assert author.counters["fetch_refused"] >= 1
            nursery.cancel_scope.cancel()
