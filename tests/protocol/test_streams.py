"""protocol/toolkit/streams.py, the one server and asker of our request-response protocols: the deadline
and what a request past it costs its peer, the limits per peer and in all, the gate, the bucket;
with real trio on fake streams, then over real libp2p streams."""

import struct

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.io.msgio import VarIntLengthMsgReadWriter
from libp2p.peer.id import ID
from libp2p.rcmgr import Direction, new_resource_manager

from sapo.protocol.toolkit.frames import FrameError, FrameLengthError, length_prefixed, read_frame
from sapo.protocol.toolkit.peer_gate import PeerGate
from sapo.protocol.toolkit.streams import Request, ServeLimits, StreamServer, ask
from sapo.protocol.wire.group_wire import MAX_REQUEST_BYTES, GroupRequest, encode_request
from tests.support.hosts import two_connected_hosts

LIMITS = ServeLimits(seconds=5.0, total=2, per_peer=1, rate=1.0, burst=2)
PROTOCOL = "/sapo-test/echo/1"


class Conn:
    def __init__(self, peer: str) -> None:
        self.peer_id = peer

    def get_transport_addresses(self):
        return []


class FakeStream:
    """A stream from `peer` whose request arrives when `arrive` is set (at once by default)."""

    def __init__(self, peer: str, request: bytes = length_prefixed(b"hello"), arrive: trio.Event | None = None):
        self.muxed_conn = Conn(peer)
        self.data, self.arrive = request, arrive
        self.reads = 0
        self.written = b""
        self.closed = self.was_reset = False

    async def read(self, n=None):
        self.reads += 1
        if self.arrive is not None:
            await self.arrive.wait()
        out, self.data = self.data[:n], self.data[n:]
        return out

    async def write(self, data):
        self.written += data

    async def close(self):
        self.closed = True

    async def reset(self):
        self.was_reset = True

    def get_remote_address(self):
        return ("10.1.2.3", 4001)


def server(limits=LIMITS, refusal=lambda peer: None):
    counts: dict[str, int] = {}
    gate = PeerGate(refusal=refusal, count=lambda name: counts.__setitem__(name, counts.get(name, 0) + 1))
    return StreamServer("echo", limits, gate, clock=trio.current_time), counts


async def echo(request: Request) -> bytes:
    return length_prefixed(request.payload[::-1])


async def test_a_request_is_read_answered_and_closed():
    served, counts = server()
    seen: list[Request] = []

    async def respond(request: Request) -> bytes:
        seen.append(request)
        return await echo(request)

    stream = FakeStream("a")
    await served.answer(stream, 64, respond)
    assert stream.written == length_prefixed(b"olleh") and stream.closed and not stream.was_reset
    assert counts == {"echo_served": 1}
    assert (seen[0].peer, seen[0].payload, seen[0].remote_ip) == ("a", b"hello", "10.1.2.3")


async def test_a_refused_peer_is_reset_before_a_byte_is_read():
    served, counts = server(refusal=lambda peer: "banned" if peer == "banned" else None)
    stream = FakeStream("banned")
    await served.answer(stream, 64, echo)
    assert stream.was_reset and stream.reads == 0 and counts == {"echo_refused": 1}


async def test_a_request_over_its_bounds_is_a_bad_request():
    served, counts = server()
    stream = FakeStream("a", struct.pack(">I", 1000) + b"x" * 1000)
    await served.answer(stream, 64, echo)
    assert stream.was_reset and stream.reads == 1 and counts == {"echo_bad_request": 1}  # the length alone was read


async def test_a_peer_gets_its_burst_then_its_rate(autojump_clock):
    served, counts = server()
    for _ in range(3):
        await served.answer(FakeStream("a"), 64, echo)
    assert counts == {"echo_served": 2, "echo_refused": 1}
    await trio.sleep(1.0)  # one back a second
    await served.answer(FakeStream("a"), 64, echo)
    assert counts["echo_served"] == 3


async def test_a_request_past_the_deadline_is_reset_counted_and_costs_its_peer_a_burst(autojump_clock):
    served, counts = server()
    slow = FakeStream("slow", arrive=trio.Event())  # opens a stream, never sends
    started = trio.current_time()
    await served.answer(slow, 64, echo)
    # a silent stream is given the read deadline, not the whole request's
    assert LIMITS.read_seconds < LIMITS.seconds
    assert trio.current_time() - started == pytest.approx(LIMITS.read_seconds)
    assert slow.was_reset and counts == {"echo_request_timeouts": 1}
    # its bucket had filled up again meanwhile, and paid a whole burst: its next request waits
    await served.answer(FakeStream("slow"), 64, echo)
    assert counts["echo_refused"] == 1
    await trio.sleep(1.0)
    await served.answer(FakeStream("slow"), 64, echo)
    assert counts["echo_served"] == 1


async def test_a_request_read_but_answered_too_slowly_runs_to_the_whole_deadline(autojump_clock):
    served, counts = server()

    async def never(request: Request) -> bytes:
        await trio.sleep_forever()
        return b""

    started = trio.current_time()
    stream = FakeStream("a")
    await served.answer(stream, 64, never)
    assert trio.current_time() - started == pytest.approx(LIMITS.seconds)
    assert stream.was_reset and counts == {"echo_request_timeouts": 1}


class RoutableStream(FakeStream):
    def __init__(self, peer: str, ip: str, arrive: trio.Event | None = None) -> None:
        super().__init__(peer, arrive=arrive)
        self.ip = ip

    def get_remote_address(self):
        return (self.ip, 4001)


async def test_one_network_group_holds_at_most_half_the_places_but_the_local_one_is_not_capped(autojump_clock):
    assert LIMITS.group_cap == 1  # half of total=2
    served, counts = server()
    hold = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(served.answer, RoutableStream("a", "8.8.1.1", arrive=hold), 64, echo)
        await trio.sleep(0.1)
        await served.answer(RoutableStream("b", "8.8.200.2"), 64, echo)  # another key, same /16
        assert counts == {"echo_refused": 1}
        await served.answer(RoutableStream("c", "9.9.1.1"), 64, echo)  # another /16
        assert counts["echo_served"] == 1
        hold.set()
    assert counts["echo_served"] == 2
    # two keys on our host or LAN: "local" has no group cap (a local swarm is all one group)
    hold = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(served.answer, RoutableStream("d", "127.0.0.1", arrive=hold), 64, echo)
        await trio.sleep(0.1)
        await served.answer(RoutableStream("e", "127.0.0.1"), 64, echo)
        assert counts["echo_served"] == 3
        hold.set()


async def test_one_peer_at_a_time_and_two_in_all_and_a_request_set_aside_frees_its_place(autojump_clock):
    served, counts = server()
    release = trio.Event()
    set_aside: list[Request] = []

    async def wait(request: Request) -> bytes:
        if request.payload == b"aside":
            request.set_aside()
            set_aside.append(request)
        await release.wait()
        return await echo(request)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(served.answer, FakeStream("a"), 64, wait)
        await trio.sleep(0.1)
        await served.answer(FakeStream("a"), 64, wait)  # a second of a's at once
        assert counts == {"echo_refused": 1}
        nursery.start_soon(served.answer, FakeStream("b"), 64, wait)
        await trio.sleep(0.1)
        assert served.serving == 2
        await served.answer(FakeStream("c"), 64, wait)  # two in all
        assert counts == {"echo_refused": 2}
        release.set()
    assert counts == {"echo_refused": 2, "echo_served": 2} and served.serving == 0

    release = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(served.answer, FakeStream("d", length_prefixed(b"aside")), 64, wait)
        nursery.start_soon(served.answer, FakeStream("e"), 64, wait)
        await trio.sleep(0.1)
        assert len(set_aside) == 1 and served.serving == 1  # d waits outside the limit
        nursery.start_soon(served.answer, FakeStream("f"), 64, wait)
        await trio.sleep(0.1)
        assert served.serving == 2 and counts["echo_refused"] == 2
        release.set()
    assert counts["echo_served"] == 5


# --- over real libp2p streams ---------------------------------------------------------------------


async def test_over_libp2p_an_answer_comes_back_and_a_stalled_peer_is_cut_off():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            host, client = await two_connected_hosts(nursery)
            served, counts = server(ServeLimits(seconds=0.5, total=4, per_peer=1, rate=10.0, burst=10))
            host.set_stream_handler(PROTOCOL, lambda stream: served.answer(stream, 64, echo))
            peer = host.get_id()

            reply = await ask(client, peer, PROTOCOL, length_prefixed(b"ping"), max_reply_bytes=64, seconds=5)
            assert reply.payload == b"gnip" and reply.remote_ip == "127.0.0.1"
            with pytest.raises(FrameError):  # an answer over what the asker reads
                await ask(client, peer, PROTOCOL, length_prefixed(b"x" * 20), max_reply_bytes=8, seconds=5)

            stalled = await client.new_stream(peer, [PROTOCOL])  # and says nothing
            with trio.fail_after(3), pytest.raises(Exception):  # noqa: B017 - reset at the server's deadline
                await stalled.read(4)
            assert counts == {"echo_served": 2, "echo_request_timeouts": 1}
            nursery.cancel_scope.cancel()


async def test_over_libp2p_the_askers_deadline_is_a_timeout_by_type():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            host, client = await two_connected_hosts(nursery)

            async def silent(stream) -> None:
                await trio.sleep_forever()

            host.set_stream_handler(PROTOCOL, silent)
            with pytest.raises(trio.TooSlowError):
                await ask(client, host.get_id(), PROTOCOL, length_prefixed(b"ping"), max_reply_bytes=64, seconds=0.5)
            nursery.cancel_scope.cancel()


# --- why not py-libp2p 0.8.1's request_response and resource manager (protocol/README.md) -------


async def test_request_responses_frame_is_not_our_wire():
    """Its frames carry a varint length; ours (every 0.4.0 peer's) a 4-byte big-endian one. Its
    request for a group reaches a 0.4.0 node as a frame of a length no request may have."""
    request = encode_request(GroupRequest("test", after=3, max_groups=2))
    payload = request[4:]
    theirs = VarIntLengthMsgReadWriter(FakeStream("x"), max_msg_size=MAX_REQUEST_BYTES).encode_msg(payload)
    assert theirs != request and theirs[1:] == payload  # one byte of length, not four
    with pytest.raises(FrameLengthError):
        await read_frame(FakeStream("x", theirs), MAX_REQUEST_BYTES)


def test_the_resource_managers_peer_limits_remember_every_peer_ever_seen_and_count_streams_twice():
    """0.8.1's swarm takes one of the host's streams per inbound stream before the protocol is
    known (`acquire_stream`), and never runs the per-protocol, per-peer limits: a service must
    call `acquire_scoped_stream` itself, which takes a second one, and keeps a counter for every
    peer id it ever saw (fresh identities are free)."""
    manager = new_resource_manager()
    manager.set_protocol_peer_stream_limit(PROTOCOL, 4)
    peers = [ID.from_pubkey(create_new_key_pair().public_key).to_base58() for _ in range(300)]
    for peer in peers:
        assert manager.acquire_scoped_stream(peer, Direction.INBOUND, protocol=PROTOCOL)
        manager.release_scoped_stream(peer, Direction.INBOUND, protocol=PROTOCOL)
    assert len(manager._protocol_peer_stream_counts) == len(peers)  # all at 0, none forgotten
    assert manager.acquire_stream(peers[0], Direction.INBOUND)  # what the swarm does
    assert manager.acquire_scoped_stream(peers[0], Direction.INBOUND, protocol=PROTOCOL)
    assert manager._current_streams == 2  # one stream
