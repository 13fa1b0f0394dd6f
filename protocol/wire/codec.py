"""Bytes <-> RolloutGroup (and SharedLogprobs). Decoding never trusts its input.

A frame is one header byte and a payload:
    0x00  payload is a msgpack map
    0x01  payload is a zlib stream of that msgpack map

The map is the message's `model_dump(mode="json")` with every map's keys sorted, so one message
always encodes to the same bytes (golden-tested). `decode` checks, in order: frame size, header,
decompressed size, bounded msgpack, schema version, modality, nesting, the pydantic schema, field
limits and the dataset allowlist. Anything wrong raises `Rejected(reason, detail)` and nothing else.
A field this release does not know is skipped, if it is nested no deeper than `max_nesting`
(the frame's size bounds the rest): see "Compatibility" in protocol/README.md.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sapo.protocol.wire.allowlist import check_problem_spec
from sapo.protocol.wire.messages import (
    LOGPROBS_SCHEMA_VERSION,
    SCHEMA_VERSION,
    BehaviorLogprobs,
    GroupLogprobs,
    Rejected,
    RejectReason,
    RolloutGroup,
    SharedLogprobs,
    WireProblemSpec,
)

__all__ = [
    "DecodeLimits",
    "Rejected",
    "RejectReason",
    "decode",
    "decode_logprobs",
    "encode",
    "encode_logprobs",
    "group_digest",
]

RAW = 0x00
ZLIB = 0x01
_ZLIB_LEVEL = 6

# A UTF-8 character is at most 4 bytes: msgpack limits are in bytes, ours in characters.
_UTF8_MAX = 4


class DecodeLimits(BaseModel):
    """Upper bounds on what a peer may send. Everything over them is rejected, not truncated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_message_bytes: int = Field(
        default=256 * 1024, gt=0, description="max frame size, and max decompressed payload size"
    )
    max_completions: int = Field(default=64, gt=0, description="max completions per group (G)")
    max_completion_chars: int = Field(default=16_384, gt=0, description="max chars per completion")
    max_question_chars: int = Field(default=8_192, gt=0, description="max chars in the question")
    max_answer_chars: int = Field(default=4_096, gt=0, description="max chars in the answer key")
    max_metadata_bytes: int = Field(default=16_384, gt=0, description="max msgpack size of the metadata map")
    max_string_chars: int = Field(
        default=256,
        gt=0,
        description="max chars of short strings: sender, swarm, model_id, versions, dataset",
    )
    max_nesting: int = Field(default=8, gt=0, description="max list/map depth inside metadata or config")
    max_container_items: int = Field(default=4_096, gt=0, description="max entries in any one msgpack array or map")


def _canonical(value: Any) -> Any:
    """Sort every map's keys (by code point, which is UTF-8 byte order) for deterministic bytes."""
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def canonical_bytes(msg: BaseModel) -> bytes:
    """The one byte rule of every message this project sends (rollouts and the judge's): msgpack
    of the model's JSON form with every map's keys sorted, so equal messages give equal bytes."""
    return canonical_json(msg.model_dump(mode="json"))


def canonical_json(value: Any) -> bytes:
    """`canonical_bytes` of plain JSON-ready data."""
    return msgpack.packb(_canonical(value), use_bin_type=True)


def encode(msg: RolloutGroup, compress: bool = True) -> bytes:
    """The frame for `msg`. Compressed only when that is smaller. Deterministic for a given message
    (and, when compressed, a given zlib build: pin golden bytes on compress=False)."""
    # an optional field that is absent leaves no trace in the frame, so frames without it are
    # byte for byte what they were before it existed (the golden file pins that)
    return _frame(
        canonical_json(msg.model_dump(mode="json", exclude={"behavior"} if msg.behavior is None else None)), compress
    )


def encode_logprobs(msg: SharedLogprobs, compress: bool = True) -> bytes:
    """The frame for a SharedLogprobs message: the same framing and byte rule as a group's."""
    return _frame(canonical_bytes(msg), compress)


def group_digest(msg: RolloutGroup) -> bytes:
    """What a group is: its author, its problem and its completions. Nothing of the envelope
    (timestamp, round, model name, the sender's own rewards) takes part, so changing it makes no
    new group. SharedLogprobs names groups by this digest (hex)."""
    content = {
        "sender": msg.sender,
        "problem": msg.problem.model_dump(mode="json"),
        "completions": list(msg.completions),
    }
    return hashlib.sha256(canonical_json(content)).digest()


def _frame(payload: bytes, compress: bool) -> bytes:
    if compress:
        packed = zlib.compress(payload, _ZLIB_LEVEL)
        if len(packed) < len(payload):
            return bytes([ZLIB]) + packed
    return bytes([RAW]) + payload


def _short(text: str, limit: int = 80) -> str:
    """Attacker text in a log line: bounded and repr-escaped."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _payload(frame: bytes, limits: DecodeLimits) -> bytes:
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise Rejected(RejectReason.bad_frame, f"frame must be bytes, got {type(frame).__name__}")
    frame = bytes(frame)
    if not frame:
        raise Rejected(RejectReason.bad_frame, "empty frame")
    if len(frame) > limits.max_message_bytes:
        raise Rejected(RejectReason.oversized, f"frame is {len(frame)} bytes, limit {limits.max_message_bytes}")
    header, body = frame[0], frame[1:]
    if header == RAW:
        return body
    if header != ZLIB:
        raise Rejected(RejectReason.bad_frame, f"unknown header byte 0x{header:02x}")
    # Inflate at most one byte past the limit: a zlib bomb costs us max_message_bytes, no more.
    inflater = zlib.decompressobj()
    try:
        payload = inflater.decompress(body, limits.max_message_bytes + 1)
    except zlib.error as exc:
        raise Rejected(RejectReason.bad_compression, str(exc)[:120]) from None
    if len(payload) > limits.max_message_bytes:
        raise Rejected(RejectReason.oversized, f"decompressed payload exceeds {limits.max_message_bytes} bytes")
    if not inflater.eof:
        raise Rejected(RejectReason.bad_compression, "truncated zlib stream")
    if inflater.unused_data:
        raise Rejected(RejectReason.bad_compression, f"{len(inflater.unused_data)} bytes after the zlib stream")
    return payload


def _unpack(payload: bytes, limits: DecodeLimits) -> Any:
    longest = _UTF8_MAX * max(
        limits.max_completion_chars,
        limits.max_question_chars,
        limits.max_answer_chars,
        limits.max_metadata_bytes,
        limits.max_string_chars,
    )
    try:
        return msgpack.unpackb(
            payload,
            raw=False,  # str must be valid UTF-8
            strict_map_key=True,  # map keys must be str (or bin, which the schema then refuses)
            use_list=True,
            max_str_len=longest,
            max_bin_len=0,  # nothing in the schema is binary
            max_array_len=limits.max_container_items,
            max_map_len=limits.max_container_items,
            max_ext_len=0,  # no ext types, including the timestamp ext
        )
    except msgpack.ExtraData:
        raise Rejected(RejectReason.bad_msgpack, "bytes after the msgpack object") from None
    except Exception as exc:  # noqa: BLE001 - msgpack raises ValueError/TypeError/UnicodeError/StackError...
        raise Rejected(RejectReason.bad_msgpack, f"{type(exc).__name__}: {str(exc)[:120]}") from None


def _depth(value: Any) -> int:
    """Container depth: a scalar is 0, [] is 1, [[1]] is 2. Iterative, so it cannot hit the
    recursion limit on hostile input (msgpack already caps nesting at 1024)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item)
    return deepest


def _precheck(obj: Any, limits: DecodeLimits) -> None:
    """What must be known before full validation: version, modality, nesting."""
    if not isinstance(obj, dict):
        raise Rejected(RejectReason.bad_schema, f"expected a map, got {type(obj).__name__}")
    version = obj.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise Rejected(RejectReason.bad_schema, "schema_version missing or not an int")
    if version != SCHEMA_VERSION:
        raise Rejected(
            RejectReason.unknown_schema_version, f"schema_version {version}, this node reads {SCHEMA_VERSION}"
        )
    modality = obj.get("modality")
    if not isinstance(modality, str):
        raise Rejected(RejectReason.bad_schema, "modality missing or not a string")
    if modality != "text":
        raise Rejected(RejectReason.unknown_modality, f"modality {_short(modality, 32)}")
    metadata = obj.get("metadata")
    problem = obj.get("problem")
    config = problem.get("config") if isinstance(problem, dict) else None
    for name, value in (("metadata", metadata), ("problem.config", config)):
        if _depth(value) > limits.max_nesting:
            raise Rejected(RejectReason.too_deep, f"{name} is nested deeper than {limits.max_nesting}")
    # Elsewhere only the fixed schema's own depth is legal (completions: 1, problem.config: 2,
    # behavior.token_logprobs: 2); fields this release does not know may nest like metadata.
    known = {k: v for k, v in obj.items() if k in _GROUP_FIELDS}
    rest = {k: v for k, v in known.items() if k not in ("metadata", "problem", "behavior")}
    if _depth(rest) > 2 or _depth(known.get("behavior")) > 3:
        raise Rejected(RejectReason.bad_schema, "unexpected nesting outside metadata and config")
    _check_unknown(obj, _GROUP_FIELDS, limits, "")
    if isinstance(problem, dict):
        _check_unknown(problem, _PROBLEM_FIELDS, limits, "problem.")
    behavior = obj.get("behavior")
    if isinstance(behavior, dict):
        _check_unknown(behavior, _BEHAVIOR_FIELDS, limits, "behavior.")


_GROUP_FIELDS = frozenset(RolloutGroup.model_fields)
_PROBLEM_FIELDS = frozenset(WireProblemSpec.model_fields)
_BEHAVIOR_FIELDS = frozenset(BehaviorLogprobs.model_fields)


def _check_unknown(obj: dict, known: frozenset[str], limits: DecodeLimits, where: str) -> None:
    """Fields a later release added are skipped, but no deeper than metadata may nest."""
    for name, value in obj.items():
        if name not in known and _depth(value) > limits.max_nesting:
            raise Rejected(
                RejectReason.too_deep,
                f"unknown field {where}{_short(str(name), 32)} is nested deeper than {limits.max_nesting}",
            )


def _schema_error(exc: ValidationError) -> Rejected:
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0] if errors else {"loc": (), "msg": str(exc)[:120]}
    where = ".".join(str(part) for part in first["loc"]) or "message"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return Rejected(RejectReason.bad_schema, f"{where}: {first['msg'][:120]}{more}")


def _check_lengths(msg: RolloutGroup, limits: DecodeLimits) -> None:
    if len(msg.completions) > limits.max_completions:
        raise Rejected(
            RejectReason.too_many_completions,
            f"{len(msg.completions)} completions, limit {limits.max_completions}",
        )
    checks = [
        ("question", msg.question, limits.max_question_chars),
        ("answer", msg.answer, limits.max_answer_chars),
        ("sender", msg.sender, limits.max_string_chars),
        ("swarm", msg.swarm, limits.max_string_chars),
        ("model_id", msg.model_id, limits.max_string_chars),
        ("reasoning_gym_version", msg.reasoning_gym_version, limits.max_string_chars),
        ("problem.dataset", msg.problem.dataset, limits.max_string_chars),
    ]
    checks += [(f"completions[{i}]", c, limits.max_completion_chars) for i, c in enumerate(msg.completions)]
    for name, text, limit in checks:
        if len(text) > limit:
            raise Rejected(RejectReason.field_too_long, f"{name} has {len(text)} chars, limit {limit}")
    metadata_bytes = len(msgpack.packb(msg.metadata, use_bin_type=True))
    if metadata_bytes > limits.max_metadata_bytes:
        raise Rejected(
            RejectReason.field_too_long,
            f"metadata is {metadata_bytes} bytes, limit {limits.max_metadata_bytes}",
        )


def decode(frame: bytes, limits: DecodeLimits) -> RolloutGroup:
    """The RolloutGroup in `frame`, or Rejected. No other exception escapes, for any input."""
    obj = _unpack(_payload(frame, limits), limits)
    _precheck(obj, limits)
    try:
        msg = RolloutGroup.model_validate(obj)
    except ValidationError as exc:
        raise _schema_error(exc) from None
    _check_lengths(msg, limits)
    check_problem_spec(msg.problem)
    return msg


def decode_logprobs(frame: bytes, limits: DecodeLimits) -> SharedLogprobs:
    """The SharedLogprobs in `frame`, or Rejected (the same checks, in the same order, as `decode`)."""
    obj = _unpack(_payload(frame, limits), limits)
    if not isinstance(obj, dict):
        raise Rejected(RejectReason.bad_schema, f"expected a map, got {type(obj).__name__}")
    version = obj.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise Rejected(RejectReason.bad_schema, "schema_version missing or not an int")
    if version != LOGPROBS_SCHEMA_VERSION:
        raise Rejected(
            RejectReason.unknown_schema_version,
            f"logprobs schema_version {version}, this node reads {LOGPROBS_SCHEMA_VERSION}",
        )
    _check_unknown(obj, _LOGPROBS_FIELDS, limits, "")
    groups = obj.get("groups")
    for entry in groups if isinstance(groups, list) else []:
        if isinstance(entry, dict):
            _check_unknown(entry, _ENTRY_FIELDS, limits, "groups[].")
            if isinstance(entry.get("behavior"), dict):
                _check_unknown(entry["behavior"], _BEHAVIOR_FIELDS, limits, "groups[].behavior.")
    # groups -> entry -> behavior -> token_logprobs -> row: 5 deep at most, unknown fields aside
    if _depth(groups) > 5:
        raise Rejected(RejectReason.bad_schema, "unexpected nesting in groups")
    try:
        msg = SharedLogprobs.model_validate(obj)
    except ValidationError as exc:
        raise _schema_error(exc) from None
    for name, text in (("sender", msg.sender), ("swarm", msg.swarm)):
        if len(text) > limits.max_string_chars:
            raise Rejected(
                RejectReason.field_too_long, f"{name} has {len(text)} chars, limit {limits.max_string_chars}"
            )
    for entry in msg.groups:
        if len(entry.behavior.token_logprobs) > limits.max_completions:
            raise Rejected(
                RejectReason.too_many_completions,
                f"{len(entry.behavior.token_logprobs)} rows of log-probs, limit {limits.max_completions}",
            )
    return msg


_LOGPROBS_FIELDS = frozenset(SharedLogprobs.model_fields)
_ENTRY_FIELDS = frozenset(GroupLogprobs.model_fields)
