"""What one request-response costs: `.venv/bin/python -m tests.protocol.request_response_cost [N]`.

Two hosts on 127.0.0.1 in this one process, one connection; N sequential requests of a 40-byte
payload answered with its echo, first through our `StreamServer.answer` and `ask`
(protocol/toolkit/streams.py), then through py-libp2p 0.8.1's `RequestResponse` (its `request_response`
package, BytesCodec). Reports wall and process CPU milliseconds per request for each, alternating
twice. protocol/README.md ("Request-response") quotes it."""

from __future__ import annotations

import sys
import time

import trio
from libp2p.custom_types import TProtocol
from libp2p.request_response import BytesCodec, RequestResponse, RequestResponseConfig

from sapo.protocol.toolkit.frames import length_prefixed
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.protocol.toolkit.streams import ServeLimits, StreamServer, ask
from tests.support.hosts import two_connected_hosts

OURS = TProtocol("/sapo-bench/ours/1")
THEIRS = TProtocol("/sapo-bench/request-response/1")
PAYLOAD = b"x" * 40


async def ours(server, client, count: int) -> None:
    async def echo(request) -> bytes:
        return length_prefixed(request.payload)

    limits = ServeLimits(seconds=5.0, total=8, per_peer=4, rate=1e9, burst=1e9)
    served = StreamServer("bench", limits, PeerGate())
    server.set_stream_handler(OURS, lambda stream: served.answer(stream, 256, echo))
    for _ in range(count):
        reply = await ask(client, server.get_id(), OURS, length_prefixed(PAYLOAD), max_reply_bytes=256, seconds=5)
        assert reply.payload == PAYLOAD


async def theirs(server, client, count: int) -> None:
    async def echo(request: bytes, context) -> bytes:
        return request

    config = RequestResponseConfig(timeout=5.0, max_request_size=256, max_response_size=256, max_concurrent_inbound=8)
    RequestResponse(server).set_handler(THEIRS, echo, BytesCodec(), config)
    asker = RequestResponse(client)
    for _ in range(count):
        assert await asker.send_request(server.get_id(), [THEIRS], PAYLOAD, BytesCodec(), config) == PAYLOAD


async def main(count: int) -> None:
    async with trio.open_nursery() as nursery:
        server, client = await two_connected_hosts(nursery)
        await ours(server, client, 20)  # warm both paths up
        await theirs(server, client, 20)
        print(f"{count} sequential requests over one connection, ms per request (wall, process CPU)")
        for _ in range(2):
            for name, run in (("sapo streams.py", ours), ("libp2p request_response", theirs)):
                wall, cpu = time.perf_counter(), time.process_time()
                await run(server, client, count)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                print(f"{name:>24}: {1000 * wall / count:6.2f} wall  {1000 * cpu / count:6.2f} CPU")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 500)
