"""Our request-response protocols' one server and one asker, on frames.py's frame.

Discovery (`/sapo/peers/1`), group fetching (`/sapo/groups/1`) and AutoNAT's dial-backs each
answer one request per stream from any peer that connects. Whatever a stranger opens costs us a
task, a stream and our CPU, so `StreamServer` spends them on one rule for all three:

- who: a peer the gate refuses (allow list, bans) gets a reset stream, before a byte is read;
- how many: at most `total` requests served at once in all (a `trio.CapacityLimiter`), at most
  `per_peer` of one peer's open, at most `per_group` open from one network group (IPv4 /16,
  IPv6 /32, every relayed peer together; hosts.py's `network_group`), and a token bucket per peer
  (`rate` a second, `burst` in a row, buckets.py); over any of them, a reset stream
  (`<name>_refused`). Peers on our host, LAN or container network (the "local" group) have no
  group cap: a local swarm is all one group, and whoever is inside it is ours to trust or not;
- how long: the request's frame within `read_seconds` of the stream opening (an asker writes it
  at once: a silent stream is only holding a place), and the request read, answered and the
  answer written within `seconds`. A request that runs past either held a place others could
  have used, so its peer pays: the stream is reset, `<name>_request_timeouts` is counted and its
  bucket is charged a whole burst (a debt that its next requests wait out);
- what it sends: one frame of at most `max_request_bytes`, its length checked before the payload
  is read (frames.py); anything that fails there or in the answer resets the stream
  (`<name>_bad_request`).

`ask` is the asking side: one stream, one request, one answer of at most `max_reply_bytes`,
everything from opening the stream within `seconds`, the stream closed after (reset, if it
brought no answer, whoever gave up on it: a cancelled caller too). A deadline
surfaces as `trio.TooSlowError`, by type: libp2p's own stream negotiation gives up only after
10 s, so within our shorter deadline ours is the only timeout there is.

Why not py-libp2p 0.8.1's `request_response` and its resource manager: protocol/README.md,
"Request-response".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.peer.id import ID

from sapo.protocol.toolkit.buckets import TokenBuckets
from sapo.protocol.toolkit.frames import read_frame
from sapo.protocol.toolkit.hosts import close_stream, is_relayed, network_group, reset_stream
from sapo.protocol.toolkit.peer_gate import PeerGate

logger = logging.getLogger("sapo.streams")

# A polite close of a stream we are done with; a peer that does not take it is cut by the reset.
CLOSE_SECONDS = 1.0
# For a request's frame (at most a few hundred bytes, written as the stream opens) to arrive:
# a round trip of 100 ms with a lost segment or two takes well under a second.
REQUEST_READ_SECONDS = 2.0


@dataclass(frozen=True)
class ServeLimits:
    """What one protocol's requests may cost us."""

    seconds: float  # to read a request, answer it and write the answer
    total: int  # requests served at once, all peers together
    per_peer: int  # one peer's requests open at once
    rate: float  # requests a peer may start a second, on average...
    burst: float  # ...and in a row
    max_tracked: int = 4096  # peers whose bucket is remembered, least recently heard forgotten
    per_group: int | None = None  # requests open at once from one network group; None: total // 2
    read_seconds: float = REQUEST_READ_SECONDS  # for the request's frame to arrive whole

    @property
    def group_cap(self) -> int:
        return self.per_group if self.per_group is not None else max(1, self.total // 2)


@dataclass(frozen=True)
class Request:
    """One request as read: who sent it (Noise authenticated the peer), its frame's payload, and
    the IP it came from (None over a relay, whose IP that would be)."""

    peer: ID
    payload: bytes
    remote_ip: str | None
    set_aside: Callable[[], None]  # it waits on us, not on our CPU: give back its place among `total`


class StreamServer:
    """Serves one protocol's streams within `limits`: see the module docstring. The `gate` says
    whom we serve (peer_gate.py) and counts, named `<name>_...`."""

    def __init__(
        self, name: str, limits: ServeLimits, gate: PeerGate, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.limits = limits
        self.gate = gate
        self.count = gate.count
        self.clock = clock
        self._serving = trio.CapacityLimiter(limits.total)
        self._open: dict[ID, int] = {}  # requests open per peer: at most `total` keys, and those set aside
        self._groups: dict[str, int] = {}  # requests open per network group but "local", likewise bounded
        self._rates: TokenBuckets[ID] = TokenBuckets(
            limits.rate, limits.burst, limits.max_tracked, floor=-float(limits.burst)
        )

    @property
    def serving(self) -> int:
        """Requests being served now, those set aside not included."""
        return self._serving.borrowed_tokens

    async def answer(self, stream: Any, max_request_bytes: int, respond: Callable[[Request], Awaitable[bytes]]) -> None:
        """Serve one frame request: `respond` turns it into the whole answer frame. Never raises."""

        async def exchange(slot: _Slot) -> None:
            with trio.fail_after(self.limits.read_seconds):
                payload = await read_frame(stream, max_request_bytes)
            request = Request(slot.peer, payload, remote_ip(stream), slot.set_aside)
            await stream.write(await respond(request))

        await self._serve(stream, exchange)

    async def handle(self, stream: Any, exchange: Callable[[Any], Awaitable[None]]) -> None:
        """Serve a stream whose frames are another library's (`exchange(stream)` reads and
        answers it, as AutoNAT's does) within the same limits. Never raises."""

        async def whole(slot: _Slot) -> None:
            await exchange(stream)

        await self._serve(stream, whole)

    async def _serve(self, stream: Any, exchange: Callable[[_Slot], Awaitable[None]]) -> None:
        peer = stream.muxed_conn.peer_id
        slot = self._admit(peer, serving_group(stream))
        if slot is None:
            self.count(f"{self.name}_refused")
            await reset_stream(stream)
            return
        try:
            silent = False
            with trio.move_on_after(self.limits.seconds) as deadline:
                try:
                    await exchange(slot)
                except trio.TooSlowError:  # the request's frame did not come in `read_seconds`
                    silent = True
            if silent or deadline.cancelled_caught:
                self.count(f"{self.name}_request_timeouts")
                self._rates.charge(peer, self.limits.burst, self.clock())
                logger.debug("%s request from %s ran past its deadline", self.name, peer)
                await reset_stream(stream)
                return
            self.count(f"{self.name}_served")
            with trio.move_on_after(CLOSE_SECONDS):
                await close_stream(stream)
        except Exception as error:  # noqa: BLE001 - hostile or dead peer: drop the stream, keep serving
            self.count(f"{self.name}_bad_request")
            logger.debug("%s request from %s refused: %s", self.name, peer, error)
            await reset_stream(stream)
        finally:
            slot.release()

    def _admit(self, peer: ID, group: str) -> _Slot | None:
        """A place for one of `peer`'s requests from network `group`, or None. Its bucket pays
        only for one admitted."""
        capped = group != "local"
        if (
            self._serving.available_tokens < 1
            or self._open.get(peer, 0) >= self.limits.per_peer
            or (capped and self._groups.get(group, 0) >= self.limits.group_cap)
            or not self.gate.may_use(peer)
            or not self._rates.take(peer, self.clock())
        ):
            return None
        slot = _Slot(self, peer, group if capped else None)
        self._serving.acquire_on_behalf_of_nowait(slot)
        _add(self._open, peer, 1)
        if slot.group is not None:
            _add(self._groups, slot.group, 1)
        return slot

    def _release(self, slot: _Slot, *, done: bool) -> None:
        if slot.serving:
            slot.serving = False
            self._serving.release_on_behalf_of(slot)
        if done:
            _add(self._open, slot.peer, -1)
            if slot.group is not None:
                _add(self._groups, slot.group, -1)


def _add(counts: dict, key: Any, step: int) -> None:
    """A count per key that keeps no zeros, so the dict holds only what is open."""
    left = counts.get(key, 0) + step
    if left:
        counts[key] = left
    else:
        del counts[key]


def serving_group(stream: Any) -> str:
    """The network group a request's place counts in: its IP's (hosts.network_group), one
    "relayed" group for every peer that reaches us through a relay (its IP is the relay's), and
    "unknown" when the transport does not say."""
    ip = remote_ip(stream)  # None over a relay, or when the transport does not say
    if ip is not None:
        return network_group(ip)
    return "relayed" if is_relayed(stream.muxed_conn) else "unknown"


class _Slot:
    """One admitted request's places: among `total` (until set aside), among its peer's and
    among its network group's (None: a local peer, which no group cap counts)."""

    def __init__(self, server: StreamServer, peer: ID, group: str | None) -> None:
        self.server = server
        self.peer = peer
        self.group = group
        self.serving = True

    def set_aside(self) -> None:
        self.server._release(self, done=False)

    def release(self) -> None:
        self.server._release(self, done=True)


@dataclass(frozen=True)
class Reply:
    """One answer: its frame's payload and the IP it came from (None over a relay)."""

    payload: bytes
    remote_ip: str | None


async def ask(host: Any, peer: ID, protocol_id: str, request: bytes, *, max_reply_bytes: int, seconds: float) -> Reply:
    """One exchange with `peer`: a stream, `request` (a whole frame) out, one frame back, all
    within `seconds`; the stream is closed after. Raises `trio.TooSlowError` past the deadline,
    `FrameError` for an answer out of bounds, and what libp2p raised otherwise (a peer lacking
    the protocol: peer_protocols.refused_protocol tells)."""
    stream = None
    answered = False
    try:
        with trio.fail_after(seconds):
            stream = await host.new_stream(peer, [protocol_id])
            await stream.write(request)
            payload = await read_frame(stream, max_reply_bytes)
        answered = True
        return Reply(payload, remote_ip(stream))
    finally:
        if stream is not None:
            # Shielded: an asker that gives up (its caller's deadline) still ends the stream, and
            # one the peer never answered is reset, or a peer that holds its end keeps ours too.
            with trio.move_on_after(CLOSE_SECONDS) as cleanup:
                cleanup.shield = True
                await (close_stream(stream) if answered else reset_stream(stream))


def remote_ip(stream: Any) -> str | None:
    """The IP a peer's stream comes from; None over a relay (that IP is the relay's)."""
    if is_relayed(stream.muxed_conn):
        return None
    try:
        remote = stream.get_remote_address()
    except Exception:  # noqa: BLE001 - not every transport knows
        return None
    return remote[0] if remote else None
