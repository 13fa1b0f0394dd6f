"""The `/sapo/groups/1` frames, and the outbox of our own groups that answers them.

A node keeps its last OUTBOX_GROUPS group frames (the v1 frames the rollouts topic carries, byte
for byte) and hands them to a peer that asks. A request names the newest round the asker already
has from us, so each group crosses each link at most once. Frames are a 4-byte big-endian
length, then one msgpack map (keys not named here are skipped, protocol/README.md
"Compatibility"):
    request   {"v": 1, "swarm": <name>, "after": <round int, -1 for none>, "max": <1..MAX_GROUPS_PER_RESPONSE>}
    response  {"v": 1, "groups": [[<round int>, <group frame bytes>], ...]}   newest first

Everything is bounded before it is read: a request is tiny, a response holds at most "max"
frames of at most `max_message_bytes` each, which is what the asker allows, not what the server
claims. A node of another swarm (several can share one libp2p network and its discovery) is
answered with no groups: they would fail its intake's swarm check anyway.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import msgpack
import trio

from sapo.protocol.toolkit.frames import FrameError, length_prefixed, unpack_map

PROTOCOL_ID = "/sapo/groups/1"
WIRE_VERSION = 1
# Groups one response may carry: a round asks each author for its newest one or two.
MAX_GROUPS_PER_RESPONSE = 4
# Our own groups kept for askers: at make run's pace (2 a round) about 8 rounds' worth, more than
# any honest asker that comes once a round can miss.
OUTBOX_GROUPS = 16
MAX_REQUEST_BYTES = 256
MAX_FRAME_KEYS = 16
# Rounds are counted from 0; a larger claim is garbage (and only ever hurts the peer that makes it).
MAX_ROUND = 2**53


class BadFrame(FrameError):
    """A `/sapo/groups/1` frame we refuse; the message is one bounded log line."""


@dataclass(frozen=True)
class GroupRequest:
    swarm: str  # the asker's swarm: groups of another are no use to it
    after: int  # the newest round the asker has from this author (-1: none)
    max_groups: int


@dataclass(frozen=True)
class ServedGroup:
    round_index: int
    frame: bytes


class Outbox:
    """Our last `capacity` group frames, oldest first; what `/sapo/groups/1` serves."""

    def __init__(self, capacity: int = OUTBOX_GROUPS) -> None:
        self._groups: deque[ServedGroup] = deque(maxlen=capacity)
        self._added = trio.Event()  # set by the next `put`, then replaced

    def __len__(self) -> int:
        return len(self._groups)

    def put(self, round_index: int, frame: bytes) -> None:
        self._groups.append(ServedGroup(round_index, frame))
        self._added.set()
        self._added = trio.Event()

    async def newer_within(self, request: GroupRequest, seconds: float) -> list[ServedGroup]:
        """`newer_than`, waiting up to `seconds` for a group to arrive if there is none yet: an
        asker that comes just before we publish gets the group as we publish it."""
        with trio.move_on_after(seconds):
            while not self.newer_than(request):
                await self._added.wait()
        return self.newer_than(request)

    def newer_than(self, request: GroupRequest) -> list[ServedGroup]:
        """At most `request.max_groups` of our groups from rounds after `request.after`, newest first."""
        newer = [g for g in reversed(self._groups) if g.round_index > request.after]
        return newer[: request.max_groups]


def response_limit(max_groups: int, max_message_bytes: int) -> int:
    """The largest response an asker reads: its own limits, whatever the server says."""
    return max_groups * (max_message_bytes + 16) + 64


def encode_request(request: GroupRequest) -> bytes:
    return _frame({"v": WIRE_VERSION, "swarm": request.swarm, "after": request.after, "max": request.max_groups})


def decode_request(payload: bytes) -> GroupRequest:
    obj = _unpack(payload, max_bin=0, max_array=0)
    swarm, after, max_groups = obj.get("swarm"), obj.get("after"), obj.get("max")
    if not isinstance(swarm, str) or not swarm:
        raise BadFrame("'swarm' must name the asker's swarm")
    if not isinstance(after, int) or isinstance(after, bool) or not -1 <= after <= MAX_ROUND:
        raise BadFrame("'after' must be a round number or -1")
    if (
        not isinstance(max_groups, int)
        or isinstance(max_groups, bool)
        or not 1 <= max_groups <= MAX_GROUPS_PER_RESPONSE
    ):
        raise BadFrame(f"'max' must be 1..{MAX_GROUPS_PER_RESPONSE}")
    return GroupRequest(swarm=swarm, after=after, max_groups=max_groups)


def encode_response(groups: list[ServedGroup]) -> bytes:
    return _frame({"v": WIRE_VERSION, "groups": [[g.round_index, g.frame] for g in groups]})


def decode_response(payload: bytes, request: GroupRequest, max_message_bytes: int) -> list[ServedGroup]:
    """The groups a server sent for `request`: no more than asked, none over our size limit,
    none from a round we did not ask for."""
    obj = _unpack(payload, max_bin=max_message_bytes, max_array=max(2, request.max_groups))
    groups = obj.get("groups")
    if not isinstance(groups, list) or len(groups) > request.max_groups:
        raise BadFrame(f"'groups' must be a list of at most {request.max_groups}")
    served = []
    for item in groups:
        if not (isinstance(item, list) and len(item) == 2 and _is_int(item[0]) and isinstance(item[1], bytes)):
            raise BadFrame("each group must be [round, frame bytes]")
        round_index, frame = item
        if not request.after < round_index <= MAX_ROUND or not 0 < len(frame) <= max_message_bytes:
            raise BadFrame("a group from a round not asked for, or of a size not allowed")
        served.append(ServedGroup(round_index, frame))
    return served


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _frame(obj: dict) -> bytes:
    return length_prefixed(msgpack.packb(obj, use_bin_type=True))


def _unpack(payload: bytes, *, max_bin: int, max_array: int) -> dict:
    return unpack_map(
        payload,
        version=WIRE_VERSION,
        what="group",
        error=BadFrame,
        max_bin=max_bin,
        max_array=max_array,
        max_keys=MAX_FRAME_KEYS,
    )
