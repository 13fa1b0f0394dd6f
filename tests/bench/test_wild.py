"""bench/wild.py's pieces that decide its numbers: the emulated link (a round trip of 2 x delay,
bytes charged to the node whose address a socket is bound to), over real loopback TCP; and the
scale model's non-negative fit, against hand-computed answers."""

from __future__ import annotations

import time
from functools import partial

import trio

from bench.scale_model import nonnegative_least_squares
from bench.wild_link import install, meter_for, uninstall


def test_the_emulated_link_delays_each_way_and_charges_the_socket_owner():
    from libp2p.io.trio import TrioTCPStream

    async def main() -> tuple[float, object]:
        meter = meter_for("127.0.0.1")

        async def echo(stream) -> None:
            wrapped = TrioTCPStream(stream)
            for _ in range(5):
                await wrapped.write(await wrapped.read(100))

        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            client = TrioTCPStream(await trio.open_tcp_stream("127.0.0.1", port))
            started = time.perf_counter()
            for _ in range(5):
                await client.write(b"x" * 50)
                assert await client.read(100) == b"x" * 50
            rtt = (time.perf_counter() - started) / 5
            nursery.cancel_scope.cancel()
        return rtt, meter

    install(0.05)
    try:
        rtt, meter = trio.run(main)
    finally:
        uninstall()
    assert 0.095 <= rtt < 0.3, rtt  # 50 ms each way, and no more than scheduling on a busy machine
    # both ends are 127.0.0.1: the one meter has both sides' 5 x 50 bytes each way
    assert (meter.bytes_in, meter.bytes_out) == (500, 500)


def test_the_nonnegative_fit_keeps_the_term_that_explains_the_data():
    # the free fit of these is y = -0.4 + 2.15 x2: a negative first term. Dropping the second
    # (the old rule) would leave y = 2.875; the non-negative fit keeps it: y = 2 x2 (28 / 14).
    xs = [[1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]
    ys = [-0.5, 2.0, 4.0, 6.0]
    assert nonnegative_least_squares(xs, ys) == [0.0, 2.0]
    # both terms free and positive: the plain least-squares answer
    b = nonnegative_least_squares([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [1.0, 2.0, 3.0])
    assert [round(v, 9) for v in b] == [1.0, 2.0]
