"""The open judge's wire: four messages on one libp2p stream per evaluation (`/sapo/judge/1`).

    node  -> judge   EvalRequest {peer_id, model_id, node_round, swarm_peers_seen, external_groups}
    judge -> node    Question    {id, task, question}                (or JudgeError)
    node  -> judge   Answer      {id, text}
    judge -> node    Score       {id, score}                         (or JudgeError)

Schema version 2. A v1 Question also carried the problem's spec (dataset, config, seed, index),
from which its answer regenerates exactly, so any node could score 1.0 without solving anything
(issue #29). A v2 Question holds only what a solver needs: the text, the task's name and a random
id that the judge alone maps back to the problem. Version 1 is retired: a v1 frame is refused as
`retired_schema_version`, and the judge tells a v1 node so in the one frame a v1 node reads
(`RetiredVersionRefusal`, a v1 JudgeError). An old judge's refusal of our v2 request is shown
the same way, with its own reason and detail.

A frame is protocol/toolkit/frames.py's, as our other stream protocols': a 4-byte big-endian payload length, then
the payload, one msgpack map, which is the message's `model_dump(mode="json")` (keys sorted)
including `schema_version` and `kind`.
Decoding never trusts its input: the length is checked against `max_frame_bytes` before a byte
of payload is read, msgpack is bounded, and the map must validate strictly as the one message
kind expected at that step. Anything wrong raises `JudgeWireError(reason, detail)`.
"""

from __future__ import annotations

import enum
from typing import Literal, Protocol, TypeVar

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sapo.protocol.toolkit.frames import FrameLengthError, FrameTruncated, length_prefixed, read_frame, unframe
from sapo.protocol.wire.codec import canonical_bytes

PROTOCOL_ID = "/sapo/judge/1"
# Bump on any change a peer of the previous version would misread.
JUDGE_SCHEMA_VERSION = 2
# Versions this release recognises and refuses with a reason the peer can act on. v1 questions
# carried the spec that regenerates their answer key (issue #29).
RETIRED_SCHEMA_VERSIONS = (1,)
# An answer is one greedy completion of at most a few hundred tokens; 64 KiB is plenty and
# keeps one frame inside one yamux window.
MAX_FRAME_BYTES = 64 * 1024

_BASE58 = r"^[1-9A-HJ-NP-Za-km-z]+$"
_ID = r"^[0-9a-f]{16,64}$"


class WireErrorReason(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() of a member, which logs and messages show
    """Why a judge frame was refused; the judge counts one per value."""

    oversized = "oversized"  # declared length over max_frame_bytes
    truncated = "truncated"  # the stream ended inside a frame
    empty = "empty"  # a zero-length payload
    bad_msgpack = "bad_msgpack"  # not exactly one well-formed msgpack object
    bad_schema = "bad_schema"  # not a valid message of the expected kind
    unknown_schema_version = "unknown_schema_version"
    retired_schema_version = "retired_schema_version"  # judge wire v1, whose questions gave away the answer
    unexpected_kind = "unexpected_kind"  # a valid message, but not the one this step expects
    wrong_question = "wrong_question"  # an Answer for a question id we did not ask
    peer_mismatch = "peer_mismatch"  # EvalRequest.peer_id is not the authenticated remote peer


class JudgeWireError(Exception):
    """A judge frame was refused. `reason` is for counters, `detail` for one log line / reply."""

    def __init__(self, reason: WireErrorReason, detail: str):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


class _Message(BaseModel):
    # fields a later release adds are skipped (protocol/README.md, "Compatibility"), within the
    # frame's byte and msgpack bounds
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True, allow_inf_nan=False)

    # A strict int pinned by bounds: Literal[1] would also accept True and 1.0.
    schema_version: int = Field(
        JUDGE_SCHEMA_VERSION, ge=JUDGE_SCHEMA_VERSION, le=JUDGE_SCHEMA_VERSION, description="judge wire version"
    )


class EvalRequest(_Message):
    """A node asks to be judged. Everything but peer_id is the node's own, unverifiable claim."""

    kind: Literal["eval_request"] = "eval_request"
    peer_id: str = Field(pattern=_BASE58, max_length=128, description="the node's libp2p peer id")
    model_id: str = Field(min_length=1, max_length=256, description="the node's model name")
    node_round: int = Field(ge=0, lt=2**63, description="the node's round counter")
    swarm_peers_seen: int = Field(ge=0, lt=2**31, description="distinct swarm peers the node has seen")
    external_groups: int = Field(0, ge=0, lt=2**63, description="external groups the node has trained on")


class Question(_Message):
    """What a solver needs and nothing that rebuilds the answer: no seed, index or config."""

    kind: Literal["question"] = "question"
    id: str = Field(pattern=_ID, description="random question id, unrelated to the problem; the Answer must echo it")
    task: str = Field(min_length=1, max_length=256, description="ReasoningGYM dataset name")
    question: str = Field(max_length=16_384, description="the question text")


class Answer(_Message):
    kind: Literal["answer"] = "answer"
    id: str = Field(pattern=_ID, description="the Question's id")
    text: str = Field(max_length=16_384, description="the node's greedy completion, decoded")


class Score(_Message):
    kind: Literal["score"] = "score"
    id: str = Field(pattern=_ID)
    score: float = Field(ge=0.0, le=1.0, description="the task verifier's score of the answer")


class JudgeError(_Message):
    """The judge's last word on a refused exchange; the stream is closed after it."""

    kind: Literal["error"] = "error"
    reason: str = Field(max_length=64)
    detail: str = Field(max_length=1024)


class RetiredVersionRefusal(JudgeError):
    """A JudgeError as a v1 peer reads it: the only frame this release writes at a retired version,
    so that a node of release 0.1.0 or 0.2.0 logs why it is not judged, instead of
    `unknown_schema_version`. Same keys as v1's error, so its bytes are v1's."""

    schema_version: int = Field(1, ge=1, le=1, description="judge wire version the peer spoke")


M = TypeVar("M", bound=_Message)


def encode(msg: _Message, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """The length-prefixed frame for `msg`. Refuses (ValueError) to build an oversized one."""
    payload = canonical_bytes(msg)
    if len(payload) > max_frame_bytes:
        raise ValueError(f"{type(msg).__name__} is {len(payload)} bytes, over the {max_frame_bytes}-byte frame limit")
    return length_prefixed(payload)


def decode_payload(payload: bytes, expected: type[M], max_frame_bytes: int = MAX_FRAME_BYTES) -> M:
    """The `expected` message in `payload` (a frame without its length prefix), or JudgeWireError.

    An error frame from the other side, where something else was expected, also raises
    JudgeWireError (unexpected_kind, with the peer's reason and detail), so callers need one
    except clause.
    """
    if len(payload) > max_frame_bytes:
        raise JudgeWireError(WireErrorReason.oversized, f"{len(payload)} bytes, limit {max_frame_bytes}")
    if not payload:
        raise JudgeWireError(WireErrorReason.empty, "zero-length payload")
    try:
        obj = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            max_str_len=max_frame_bytes,
            max_bin_len=0,
            max_array_len=256,
            max_map_len=256,
            max_ext_len=0,
        )
    except msgpack.ExtraData:
        raise JudgeWireError(WireErrorReason.bad_msgpack, "bytes after the msgpack object") from None
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types on hostile input
        raise JudgeWireError(WireErrorReason.bad_msgpack, f"{type(exc).__name__}: {str(exc)[:120]}") from None
    if not isinstance(obj, dict):
        raise JudgeWireError(WireErrorReason.bad_schema, f"expected a map, got {type(obj).__name__}")
    version = obj.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise JudgeWireError(WireErrorReason.bad_schema, "schema_version missing or not an int")
    if version in RETIRED_SCHEMA_VERSIONS:
        raise JudgeWireError(WireErrorReason.retired_schema_version, _retired_detail(obj, version))
    if version != JUDGE_SCHEMA_VERSION:
        raise JudgeWireError(
            WireErrorReason.unknown_schema_version, f"schema_version {version}, this side speaks {JUDGE_SCHEMA_VERSION}"
        )
    kind = obj.get("kind")
    want = expected.model_fields["kind"].default
    if kind != want:
        if kind == "error" and expected is not JudgeError:
            try:
                error = JudgeError.model_validate(obj)
                detail = f"the judge refused: {error.reason}: {error.detail}"
            except ValidationError:
                detail = "the judge sent a malformed error frame"
            raise JudgeWireError(WireErrorReason.unexpected_kind, detail)
        shown = repr(kind)[:40] if isinstance(kind, str) else type(kind).__name__
        raise JudgeWireError(WireErrorReason.unexpected_kind, f"expected {want!r}, got kind {shown}")
    try:
        return expected.model_validate(obj)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        first = errors[0]
        where = ".".join(str(part) for part in first["loc"]) or "message"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise JudgeWireError(WireErrorReason.bad_schema, f"{where}: {first['msg'][:120]}{more}") from None


def _retired_detail(obj: dict, version: int) -> str:
    """What to tell (or log about) a peer that speaks a retired version. An error frame is the old
    peer's own refusal (an old judge refusing our request): its reason and detail are shown."""
    why = (
        f"judge wire v{version} sent each question's spec, from which its answer regenerates (issue #29); "
        f"this side speaks v{JUDGE_SCHEMA_VERSION} only"
    )
    if obj.get("kind") != "error":
        return f"{why}: upgrade the node to sapo 0.3.0 or later"
    try:
        error = RetiredVersionRefusal.model_validate(obj)
        refused = f"{error.reason}: {error.detail}"
    except ValidationError:
        refused = "a malformed error frame"
    return f"the judge refused: {refused} ({why}: ask its operator to upgrade it to sapo 0.3.0 or later)"


def decode(frame: bytes, expected: type[M], max_frame_bytes: int = MAX_FRAME_BYTES) -> M:
    """Like `decode_payload`, for a whole frame (length prefix included, and checked)."""
    try:
        payload = unframe(frame, max_frame_bytes)
    except FrameTruncated as error:
        raise JudgeWireError(WireErrorReason.truncated, str(error)) from None
    except FrameLengthError as error:
        raise _length_refused(error, max_frame_bytes) from None
    return decode_payload(payload, expected, max_frame_bytes)


def _length_refused(error: FrameLengthError, max_frame_bytes: int) -> JudgeWireError:
    if error.length == 0:
        return JudgeWireError(WireErrorReason.empty, "zero-length payload")
    return JudgeWireError(WireErrorReason.oversized, f"declared {error.length} bytes, limit {max_frame_bytes}")


class ByteStream(Protocol):
    """What a libp2p stream offers (and what tests fake)."""

    async def read(self, n: int | None = None) -> bytes: ...

    async def write(self, data: bytes) -> None: ...


async def read_message(stream: ByteStream, expected: type[M], max_frame_bytes: int = MAX_FRAME_BYTES) -> M:
    """Read one frame and decode it as `expected`. The length is checked before the payload is
    read, so a hostile length costs us 4 bytes, not an allocation. Callers bound it in time."""
    try:
        payload = await read_frame(stream, max_frame_bytes)
    except FrameLengthError as error:
        raise _length_refused(error, max_frame_bytes) from None
    except FrameTruncated as error:
        raise JudgeWireError(WireErrorReason.truncated, str(error)) from None
    except Exception as error:  # noqa: BLE001 - libp2p raises StreamEOF/StreamReset/...
        raise JudgeWireError(
            WireErrorReason.truncated, f"the stream ended inside a frame ({type(error).__name__})"
        ) from None
    return decode_payload(payload, expected, max_frame_bytes)


async def write_message(stream: ByteStream, msg: _Message, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
    await stream.write(encode(msg, max_frame_bytes))
