"""One bounded queue per route between the network and the node's intake.

Why: fetched groups and gossiped messages once shared one 256-place channel. In fetch mode a
node asks for the groups it will train on; everything on the topic came unasked (older
releases, log-probs), and a flood of it filled the channel, so the groups the node had asked
for were dropped at the door. Each route now has its own places: what comes by gossip can fill
only gossip's, and the intake takes from the two in turn, so neither starves the other.

`ArrivalQueues` is a drop-in for the memory channel's two ends the network and the exchange
use: `send_nowait` (trio.WouldBlock when that route's queue is full: the network drops and
counts), `close`, and `async for arrival in queues`. One consumer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import trio
from trio.lowlevel import ParkingLot

from sapo.protocol.exchange.arrivals import Arrival, Route


class ArrivalQueues:
    def __init__(self, places: Mapping[Route, int]) -> None:
        """`places`: how many arrivals each route may have waiting (0: that route is refused)."""
        if any(n < 0 for n in places.values()) or not any(places.values()):
            raise ValueError("arrival queues need a non-negative size per route, and one above 0")
        self._places: dict[Route, int] = {"fetch": places.get("fetch", 0), "gossip": places.get("gossip", 0)}
        self._queues: dict[Route, deque[Arrival]] = {route: deque() for route in self._places}
        self._turn: Route = "fetch"  # the route served first when both wait
        self._lot = ParkingLot()
        self._closed = False

    def send_nowait(self, arrival: Arrival) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the node stopped taking arrivals")
        queue = self._queues[arrival.route]
        if len(queue) >= self._places[arrival.route]:
            raise trio.WouldBlock
        queue.append(arrival)
        self._lot.unpark()

    def close(self) -> None:
        """No more arrivals; the consumer takes what waits, then its loop ends."""
        self._closed = True
        self._lot.unpark_all()

    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    async def receive(self) -> Arrival:
        """The next arrival, the two routes in turn; trio.EndOfChannel once closed and empty."""
        while True:
            for route in (self._turn, _other(self._turn)):
                if self._queues[route]:
                    self._turn = _other(route)
                    await trio.lowlevel.checkpoint()
                    return self._queues[route].popleft()
            if self._closed:
                raise trio.EndOfChannel
            await self._lot.park()

    def __aiter__(self) -> ArrivalQueues:
        return self

    async def __anext__(self) -> Arrival:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None


def _other(route: Route) -> Route:
    return "gossip" if route == "fetch" else "fetch"


__all__ = ["ArrivalQueues"]
