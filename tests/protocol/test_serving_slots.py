"""Serving that no one can hold (issue #41): a peer that opens `/sapo/groups/1` and
`/sapo/peers/1` streams as fast as the server lets it and never writes a request holds at most
one place of each protocol, for at most the request-read deadline, and pays for it in its
request budget. Real hosts on 127.0.0.1; the attacker speaks raw libp2p streams."""

import math

import trio

from sapo.protocol.exchange.discovery import MAX_CONCURRENT_SERVES as DISCOVERY_SERVES
from sapo.protocol.exchange.group_fetch import MAX_CONCURRENT_SERVES as FETCH_SERVES
from sapo.protocol.exchange.group_fetch import STREAM_TIMEOUT_SECONDS
from sapo.protocol.toolkit import streams
from sapo.protocol.toolkit.streams import REQUEST_READ_SECONDS
from sapo.protocol.wire import group_wire, peer_records
from sapo.protocol.wire.group_wire import GroupRequest, decode_response, encode_request
from tests.support.gossip import start_node

HONEST_ASKS = 60


async def connected(node, other) -> None:
    with trio.fail_after(10):
        while other.service.peer_id not in node.service.connected_peers():
            await trio.sleep(0.05)


# A stream the server took (rather than reset at once) lives at least this long.
TAKEN_SECONDS = 0.5


async def hold_silent_streams(host, peer, protocol_id: str, held: list[tuple[float, float]]) -> None:
    """Open streams to `peer` 100 a second and never write: each waits until the server resets
    it. `held` gets (opened, reset) of each stream the server took."""

    async def one() -> None:
        try:
            stream = await host.new_stream(peer, [protocol_id])
        except Exception:  # noqa: BLE001 - refused at negotiation: try again
            return
        opened = trio.current_time()
        try:
            with trio.move_on_after(3 * STREAM_TIMEOUT_SECONDS):
                await stream.read(1)  # never answered: the server resets it or we give up
        except Exception:  # noqa: BLE001 - the reset we are waiting for
            pass
        if trio.current_time() - opened >= TAKEN_SECONDS:
            held.append((opened, trio.current_time()))

    async with trio.open_nursery() as nursery:
        while True:
            nursery.start_soon(one)
            await trio.sleep(0.01)  # 100 new streams a second, far past any budget


async def test_silent_streams_at_the_maximum_rate_hold_one_place_and_honest_fetches_all_succeed():
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            author = await start_node(nursery)
            attacker = await start_node(nursery, peers=[author.addr])
            honest = await start_node(nursery, peers=[author.addr])
            await connected(attacker, author)
            await connected(honest, author)
            assert await author.service.share(b"a group", 0)
            held: dict[str, list[tuple[float, float]]] = {"groups": [], "peers": []}
            attack = trio.CancelScope()

            async def attack_both() -> None:
                with attack:
                    async with trio.open_nursery() as inner:
                        for protocol_id, key in (
                            (group_wire.PROTOCOL_ID, "groups"),
                            (peer_records.PROTOCOL_ID, "peers"),
                        ):
                            inner.start_soon(
                                hold_silent_streams, attacker.service.host, author.service.my_id, protocol_id, held[key]
                            )

            nursery.start_soon(attack_both)
            await trio.sleep(2 * REQUEST_READ_SECONDS)  # the attack at its steady state
            served = failed = 0
            for _ in range(HONEST_ASKS):
                request = GroupRequest("test", after=-1, max_groups=1)
                try:
                    reply = await streams.ask(
                        honest.service.host,
                        author.service.my_id,
                        group_wire.PROTOCOL_ID,
                        encode_request(request),
                        max_reply_bytes=4096,
                        seconds=STREAM_TIMEOUT_SECONDS,
                    )
                    served += decode_response(reply.payload, request, 4096) != []
                except Exception:  # noqa: BLE001 - what we count
                    failed += 1
                await trio.sleep(0.5)  # the honest asker's pace, within its budget
            attack.cancel()
            counts = author.counters
            assert served >= math.ceil(0.99 * HONEST_ASKS), (served, failed, counts)
            for protocol, name, capacity in (
                ("groups", "fetch", FETCH_SERVES),
                ("peers", "discovery", DISCOVERY_SERVES),
            ):
                taken = held[protocol]
                assert taken, f"the attacker never got a {protocol} stream: the test attacked nothing"
                # one place at a time (of `capacity`), each for at most the read deadline
                assert most_at_once(taken) == 1 < capacity, (protocol, most_at_once(taken))
                assert max(end - start for start, end in taken) < REQUEST_READ_SECONDS + 1.0, protocol
                assert counts[f"{name}_request_timeouts"] >= len(taken) - 1  # each charged to its budget
                assert counts[f"{name}_refused"] > 10 * len(taken)  # the rest reset before a byte was read
            nursery.cancel_scope.cancel()


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most
