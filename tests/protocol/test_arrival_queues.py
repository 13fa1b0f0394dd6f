"""The node's arrivals wait in one bounded queue per route (protocol/exchange/arrival_queues.py):
a flood by one route fills only its own places, and the intake takes the two routes in turn."""

import pytest
import trio

from sapo.protocol.exchange.arrival_queues import ArrivalQueues
from sapo.protocol.exchange.arrivals import Arrival


def fetched(i: int) -> Arrival:
    return Arrival.fetched(f"author{i}", b"group", 0.0)


def gossiped(i: int) -> Arrival:
    return Arrival.gossiped(f"signer{i}", b"pushed", 0.0, "topic")


def test_a_flood_on_the_topic_takes_no_place_of_an_asked_for_group():
    queues = ArrivalQueues({"fetch": 4, "gossip": 2})
    queues.send_nowait(gossiped(0))
    queues.send_nowait(gossiped(1))
    for i in range(1000):
        with pytest.raises(trio.WouldBlock):
            queues.send_nowait(gossiped(2 + i))
    for i in range(4):
        queues.send_nowait(fetched(i))  # every asked-for group still has its place
    with pytest.raises(trio.WouldBlock):
        queues.send_nowait(fetched(4))
    assert queues.waiting() == 6


async def test_the_intake_takes_the_routes_in_turn_then_ends_when_closed():
    queues = ArrivalQueues({"fetch": 8, "gossip": 8})
    for i in range(3):
        queues.send_nowait(gossiped(i))
    for i in range(5):
        queues.send_nowait(fetched(i))
    queues.close()
    with pytest.raises(trio.ClosedResourceError):
        queues.send_nowait(fetched(9))
    order = [arrival.route async for arrival in queues]
    assert order == ["fetch", "gossip"] * 3 + ["fetch"] * 2


async def test_a_waiting_intake_wakes_for_the_next_arrival():
    queues = ArrivalQueues({"fetch": 1, "gossip": 1})
    got = []

    async def intake():
        async for arrival in queues:
            got.append(arrival.sender)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(intake)
        await trio.sleep(0.05)
        queues.send_nowait(fetched(1))
        await trio.sleep(0.05)
        queues.send_nowait(gossiped(2))
        await trio.sleep(0.05)
        queues.close()
    assert got == ["author1", "signer2"]


def test_sizes_are_checked():
    with pytest.raises(ValueError):
        ArrivalQueues({"fetch": 0, "gossip": 0})
    with pytest.raises(ValueError):
        ArrivalQueues({"fetch": -1, "gossip": 4})
