"""The frame our own stream protocols share (`/sapo/peers/1`, `/sapo/groups/1`, `/sapo/judge/1`):
a 4-byte big-endian length, then one msgpack map, each bounded before it is read."""

from __future__ import annotations

import struct
from typing import Any

import msgpack

_HEADER = struct.Struct(">I")


class FrameError(ValueError):
    """A frame we refuse; the message is one bounded log line."""


class FrameLengthError(FrameError):
    """A declared length of 0 or over the limit, refused before a byte of the payload is read."""

    def __init__(self, length: int, max_bytes: int) -> None:
        super().__init__(f"declared frame length {length} is not 1..{max_bytes}")
        self.length = length


class FrameTruncated(FrameError):
    """The bytes ended inside a frame (or, for a frame held whole, did not end with it)."""


def length_prefixed(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload)) + payload


async def read_frame(stream: Any, max_bytes: int) -> bytes:
    """One frame's payload; the length is checked before the payload is read. Callers bound time."""
    (length,) = _HEADER.unpack(await _read_exactly(stream, _HEADER.size))
    if not 0 < length <= max_bytes:
        raise FrameLengthError(length, max_bytes)
    return await _read_exactly(stream, length)


def unframe(frame: bytes, max_bytes: int) -> bytes:
    """The payload of one whole frame held in memory, checked as `read_frame` checks a stream's:
    the header, the declared length against `max_bytes`, then that exactly the payload follows."""
    if len(frame) < _HEADER.size:
        raise FrameTruncated(f"{len(frame)} bytes, shorter than the length prefix")
    (length,) = _HEADER.unpack_from(frame)
    if length > max_bytes:
        raise FrameLengthError(length, max_bytes)
    payload = frame[_HEADER.size :]
    if len(payload) != length:
        raise FrameTruncated(f"declared {length} bytes, got {len(payload)}")
    if not length:
        raise FrameLengthError(length, max_bytes)
    return payload


def unpack_map(
    payload: bytes,
    *,
    version: int,
    what: str,
    error: type[FrameError],
    max_bin: int,
    max_array: int,
    max_keys: int,
) -> dict:
    """A version `version` msgpack map within these bounds (strings at most 64 characters, no
    ext types, string keys only), else `error`."""
    try:
        obj = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_bin,
            max_str_len=64,
            max_array_len=max_array,
            max_map_len=max_keys,
            max_ext_len=0,
        )
    except Exception as failure:  # noqa: BLE001 - msgpack raises several types on garbage
        raise error(f"not a bounded msgpack map ({type(failure).__name__})") from None
    if not isinstance(obj, dict) or obj.get("v") != version or isinstance(obj.get("v"), bool):
        raise error(f"not a version {version} {what} map")
    return obj


async def _read_exactly(stream: Any, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = await stream.read(remaining)
        if not chunk:
            raise FrameTruncated(f"stream ended after {n - remaining} of {n} bytes")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
