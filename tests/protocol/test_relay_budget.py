"""The relay's one budget for all its reservations (relay_guards.RelayBudget): circuits open at
once, relayed bytes a second (the CPU it takes from training) and an hour. Several private peers
on 127.0.0.1 hold slots on one relay, as in test_relay.py; the caps hold for all of them together."""

import time

import multiaddr
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from sapo.protocol.reach.relay_guards import MIN_CIRCUIT_BYTES, RelayBudget
from tests.support.gossip import start_node
from tests.support.relay import PRIVATE, dial_through_relay, kinds, wait_until

SINK = TProtocol("/sapo-test/sink/1")


def test_budget_counts_circuits_slows_bytes_and_stops_at_the_hours_bytes():
    now = [0.0]
    budget = RelayBudget(max_circuits=2, bytes_per_second=1000, bytes_per_hour=3600 * 100, clock=lambda: now[0])
    assert budget.open_circuit() is None and budget.open_circuit() is None
    assert budget.open_circuit() == "relay_refused_circuits"
    budget.close_circuit()
    assert budget.open_circuit() is None
    assert budget.spend(1000) == 0.0  # one second's bytes pass at once
    assert budget.spend(500) == 0.5  # then they wait for the rate: 500 bytes of debt at 1000/s
    assert budget.spend(500) == 1.0  # debts add up, whichever circuit pays
    now[0] = 1.0
    assert budget.spend(0) == 0.0  # waited out
    # The hour: 360,000 bytes, refilled at 100 a second; 2,000 spent above, 100 back since.
    assert budget.spend(358_100) is not None
    assert budget.spend(10) is None  # spent: the circuit is cut
    budget.close_circuit()
    assert budget.open_circuit() == "relay_refused_bytes"
    now[0] += MIN_CIRCUIT_BYTES / 100  # refilled enough for a new circuit to be worth opening
    assert budget.open_circuit() is None


async def open_sink(node, received: dict[str, int]) -> None:
    async def sink(stream) -> None:
        sender = stream.muxed_conn.peer_id.to_base58()
        while True:
            try:
                data = await stream.read(65536)
            except Exception:  # noqa: BLE001 - cut by the relay
                return
            if not data:
                return
            received[sender] = received.get(sender, 0) + len(data)

    node.service.host.set_stream_handler(SINK, sink)


async def send(sender, receiver, size: int) -> None:
    stream = await sender.service.host.new_stream(ID.from_base58(receiver.service.peer_id), [SINK])
    chunk = b"x" * 16384
    for _ in range(size // len(chunk)):
        await stream.write(chunk)
    await stream.close()


async def test_several_reservers_share_the_relays_circuits():
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            relay = await start_node(nursery, relay="on", reachability="public", discover_peers=0, relay_max_circuits=1)
            a, b, c = [await start_node(nursery, peers=[relay.addr], **PRIVATE) for _ in range(3)]
            await wait_until(lambda: all(n.service.status().relayed_addrs for n in (a, b, c)), 30)
            await dial_through_relay(a, b)  # the relay's one circuit
            await wait_until(lambda: kinds(a, b) == {True}, 20)
            for target in (a, b):  # c holds its own slot (16 circuits a slot), yet the relay is full
                await c.service.dialer.dial(relayed_info(target))
            assert kinds(c, a) == set() and kinds(c, b) == set()
            assert relay.counters.get("relay_refused_circuits", 0) >= 2, relay.counters
            assert relay.service.relay.protocol.budget.circuits == 1
            nursery.cancel_scope.cancel()


def relayed_info(node) -> PeerInfo:
    (circuit,) = node.service.status().relayed_addrs
    return PeerInfo(ID.from_base58(node.service.peer_id), [multiaddr.Multiaddr(circuit)])


async def test_several_circuits_together_are_held_to_the_relays_byte_rate():
    rate = 128 * 1024
    size = 384 * 1024
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            relay = await start_node(
                nursery, relay="on", reachability="public", discover_peers=0, relay_max_bytes_per_second=rate
            )
            a, b, c = [await start_node(nursery, peers=[relay.addr], **PRIVATE) for _ in range(3)]
            await wait_until(lambda: all(n.service.status().relayed_addrs for n in (a, b, c)), 30)
            await dial_through_relay(a, b)
            await dial_through_relay(c, b)
            await wait_until(lambda: kinds(a, b) == {True} and kinds(c, b) == {True}, 20)
            received: dict[str, int] = {}
            await open_sink(b, received)
            start = time.monotonic()
            async with trio.open_nursery() as senders:
                senders.start_soon(send, a, b, size)
                senders.start_soon(send, c, b, size)
            await wait_until(lambda: sum(received.values()) >= 2 * size, 60)
            elapsed = time.monotonic() - start
            # Both circuits' bytes (plus Noise, yamux and gossip around them) through one bucket of
            # `rate` a second holding one second: at least (2 x size - rate) / rate seconds.
            assert elapsed >= (2 * size - rate) / rate * 0.95, elapsed
            assert relay.counters.get("relay_throttled", 0) > 0, relay.counters
            nursery.cancel_scope.cancel()


async def test_the_hours_bytes_once_spent_cut_circuits_and_refuse_new_ones():
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            relay = await start_node(
                nursery,
                relay="on",
                reachability="public",
                discover_peers=0,
                relay_max_bytes_per_hour=1024 * 1024,
                relay_max_bytes_per_second=64 * 1024 * 1024,
            )
            a, b, c = [await start_node(nursery, peers=[relay.addr], **PRIVATE) for _ in range(3)]
            await wait_until(lambda: all(n.service.status().relayed_addrs for n in (a, b, c)), 30)
            await dial_through_relay(a, b)
            await wait_until(lambda: kinds(a, b) == {True}, 20)
            received: dict[str, int] = {}
            await open_sink(b, received)
            with trio.move_on_after(20):
                try:
                    await send(a, b, 2 * 1024 * 1024)
                except Exception:  # noqa: BLE001 - the relay cut the circuit under it
                    pass
            await wait_until(lambda: relay.counters.get("relay_circuits_limited", 0) >= 1, 20)
            assert sum(received.values()) <= 1024 * 1024
            await c.service.dialer.dial(relayed_info(b))  # a second reserver, a new circuit
            assert kinds(c, b) == set()
            assert relay.counters.get("relay_refused_bytes", 0) >= 1, relay.counters
            nursery.cancel_scope.cancel()
