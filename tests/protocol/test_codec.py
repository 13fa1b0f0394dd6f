"""The frame format, pinned with golden bytes, and a decoder that refuses everything else cleanly."""

from __future__ import annotations

import math
import pathlib
import zlib

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings

from sapo.protocol.wire.codec import DecodeLimits, Rejected, RejectReason, decode, encode
from sapo.protocol.wire.messages import SCHEMA_VERSION, BehaviorLogprobs, RolloutGroup, WireProblemSpec
from tests.support.strategies import (
    SAMPLE_SENDER,
    frame_of,
    hostile_frames,
    message_dict,
    rollout_groups,
    sample_message,
)

# written by release 0.1.0's own code (tests/protocol/golden/generate.py); every release decodes it
GOLDEN = pathlib.Path(__file__).parent / "golden" / "0.1.0" / "rollout_group_v1.bin"
LIMITS = DecodeLimits()


def golden_message() -> RolloutGroup:
    """Never edit: the golden file pins exactly this message. A format change needs a new
    schema version and a new golden file next to this one."""
    return RolloutGroup(
        schema_version=1,
        sender="12D3KooWGzh6X5bXvYJXyVWuXWoMf1Mhj6D6qVuYzjXfYqZ3nW9E",
        swarm="sapo-golden",
        sender_round=12,
        created_at=1_735_689_600.5,
        modality="text",
        problem=WireProblemSpec(
            dataset="basic_arithmetic",
            # Deliberately out of key order: the encoder must sort map keys.
            config={"operators": ["+", "-"], "min_terms": 2, "max_terms": 2, "allow_negation": False},
            seed=1234,
            index=5,
        ),
        question="Calculate 3 + 4 =",
        answer="7",
        metadata={"source_index": 5, "source_dataset": "basic_arithmetic", "difficulty": {"num_terms": [2, 2]}},
        model_id="SmolLM2-135M-Instruct",
        completions=["3 plus 4 is 7. <answer>7</answer>", "<answer>8</answer>", "Ünïcödé ✓ 🙂"],
        sender_rewards=[1.0, 0.0, 0.0],
        reasoning_gym_version="0.1.25",
    )


def reason_of(frame: bytes, limits: DecodeLimits = LIMITS) -> RejectReason:
    with pytest.raises(Rejected) as info:
        decode(frame, limits)
    return info.value.reason


# --- golden bytes ---------------------------------------------------------------------------


def test_golden_bytes_are_stable():
    assert encode(golden_message(), compress=False) == GOLDEN.read_bytes()


def test_golden_file_decodes_to_the_fixed_message():
    assert decode(GOLDEN.read_bytes(), LIMITS) == golden_message()


def test_golden_layout_is_a_sorted_fixmap_after_a_raw_header():
    data = GOLDEN.read_bytes()
    assert data[0] == 0x00
    assert data[1] == 0x8E  # fixmap of the 14 fields
    obj = msgpack.unpackb(data[1:], raw=False)
    assert list(obj) == sorted(obj)
    assert list(obj["problem"]) == ["config", "dataset", "index", "seed"]
    assert list(obj["problem"]["config"]) == sorted(obj["problem"]["config"])
    assert isinstance(obj["created_at"], float) and isinstance(obj["sender_rewards"][0], float)


def test_compressed_golden_decodes_to_the_same_message():
    # zlib output may differ between zlib builds, so compressed bytes are not pinned; the
    # payload inside them is.
    frame = encode(golden_message(), compress=True)
    payload = zlib.decompress(frame[1:]) if frame[0] == 0x01 else frame[1:]
    assert payload == GOLDEN.read_bytes()[1:]
    assert decode(frame, LIMITS) == golden_message()


# --- round trips ----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rollout_groups())
def test_valid_messages_round_trip_byte_for_byte(msg):
    for compress in (False, True):
        frame = encode(msg, compress=compress)
        decoded = decode(frame, LIMITS)
        assert decoded == msg
        assert encode(decoded, compress=compress) == frame


def test_compression_is_used_only_when_smaller(monkeypatch):
    big = sample_message(completions=["the same words " * 60] * 8, sender_rewards=[0.0] * 8)
    frame = encode(big)
    assert frame[0] == 0x01 and len(frame) < len(encode(big, compress=False))
    # Every real message has compressible keys, so make zlib lose to see the raw fallback.
    monkeypatch.setattr("sapo.protocol.wire.codec.zlib.compress", lambda data, level: data + b"!")
    assert encode(big) == encode(big, compress=False)


def test_key_order_of_free_form_maps_does_not_change_bytes():
    a = sample_message(metadata={"a": 1, "b": {"y": 2, "x": 3}})
    b = sample_message(metadata={"b": {"x": 3, "y": 2}, "a": 1})
    assert encode(a, compress=False) == encode(b, compress=False)


# --- one crafted input per rejection reason -------------------------------------------------


def test_oversized_frame():
    small = DecodeLimits(max_message_bytes=64)
    assert reason_of(encode(sample_message(), compress=False), small) == RejectReason.oversized


def test_oversized_after_decompression_zlib_bomb():
    bomb = b"\x01" + zlib.compress(b"\x00" * (64 * 1024 * 1024), 9)
    assert len(bomb) < LIMITS.max_message_bytes
    assert reason_of(bomb) == RejectReason.oversized


@pytest.mark.parametrize("frame", [b"", b"\x02" + b"\x80", b"\xff", bytearray()])
def test_bad_frame(frame):
    assert reason_of(frame) == RejectReason.bad_frame


def test_non_bytes_input_is_a_bad_frame():
    assert reason_of("not bytes") == RejectReason.bad_frame  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "frame",
    [
        b"\x01not zlib",
        b"\x01" + zlib.compress(b"\x80")[:-3],  # truncated stream
        b"\x01" + zlib.compress(b"\x80") + b"trailing",
    ],
)
def test_bad_compression(frame):
    assert reason_of(frame) == RejectReason.bad_compression


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # nothing
        b"\x81\xa3abc",  # truncated map
        b"\x80\x80",  # extra data
        b"\xa2\xff\xfe",  # invalid UTF-8
        b"\xd6\xff\x00\x00\x00\x00",  # ext type (timestamp)
        b"\xc4\x01x",  # bin
        b"\x81\x01\x02",  # int map key
        b"\xdd\xff\xff\xff\xff",  # array claiming 2**32-1 elements
        b"\xdf\xff\xff\xff\xff",  # map claiming 2**32-1 entries
        b"\xdb\xff\xff\xff\xff",  # str claiming 4 GiB
        b"\x91" * 5000 + b"\xc0",  # deeper than msgpack's own stack
        b"\xc1",  # never-used byte
    ],
)
def test_bad_msgpack(payload):
    assert reason_of(b"\x00" + payload) == RejectReason.bad_msgpack


def _with(**changes) -> bytes:
    obj = message_dict()
    for key, value in changes.items():
        if value is _DROP:
            obj.pop(key)
        else:
            obj[key] = value
    return frame_of(obj)


_DROP = object()


@pytest.mark.parametrize(
    "changes",
    [
        {"sender_round": -1},
        {"sender_round": "3"},
        {"created_at": math.nan},
        {"created_at": math.inf},
        {"created_at": -5.0},
        {"sender_rewards": [1.0, math.nan]},
        {"sender_rewards": [1.0]},  # length differs from completions
        {"completions": [], "sender_rewards": []},
        {"completions": ["a", 3]},
        {"question": None},
        {"sender": "0OIl not base58"},
        {"sender": ""},
        {"swarm": ""},
        {"answer": _DROP},
        {"problem": "basic_arithmetic"},
        {"metadata": {"x": [1, 2]}, "sender_round": True},
    ],
)
def test_bad_schema(changes):
    assert reason_of(_with(**changes)) == RejectReason.bad_schema


def test_bad_schema_in_the_problem_spec():
    for field, value in [("seed", -1), ("index", 2**31), ("dataset", 5), ("config", [1])]:
        obj = message_dict()
        obj["problem"][field] = value
        assert reason_of(frame_of(obj)) == RejectReason.bad_schema, field


def test_top_level_must_be_a_map():
    assert reason_of(frame_of([1, 2, 3])) == RejectReason.bad_schema


@pytest.mark.parametrize("version", [None, "1", 1.0, True, _DROP])
def test_missing_or_mistyped_version_is_bad_schema(version):
    assert reason_of(_with(schema_version=version)) == RejectReason.bad_schema


@pytest.mark.parametrize("version", [0, 2, 99, 2**64 - 1, -1])
def test_unknown_schema_version(version):
    # A v2 message may have any shape; the version alone decides.
    assert reason_of(frame_of({"schema_version": version, "anything": [1]})) == RejectReason.unknown_schema_version


def test_unknown_modality_is_distinguishable():
    assert reason_of(_with(modality="image")) == RejectReason.unknown_modality
    assert reason_of(_with(modality=3)) == RejectReason.bad_schema


def test_too_deep_metadata_and_config():
    nested: object = 1
    for _ in range(LIMITS.max_nesting + 1):
        nested = [nested]
    assert reason_of(_with(metadata={"deep": nested})) == RejectReason.too_deep
    obj = message_dict()
    obj["problem"]["config"] = {"operators": nested}
    assert reason_of(frame_of(obj)) == RejectReason.too_deep


def test_nesting_at_the_limit_is_fine():
    nested: object = 1
    for _ in range(LIMITS.max_nesting - 1):
        nested = [nested]
    assert decode(_with(metadata={"deep": nested}), LIMITS).metadata == {"deep": nested}


def test_unknown_dataset():
    obj = message_dict()
    obj["problem"]["dataset"] = "leg_counting"
    obj["problem"]["config"] = {}
    assert reason_of(frame_of(obj)) == RejectReason.unknown_dataset


def test_config_out_of_range():
    obj = message_dict()
    obj["problem"]["config"] = {"max_digits": 10_000}
    assert reason_of(frame_of(obj)) == RejectReason.config_out_of_range


def test_too_many_completions():
    n = LIMITS.max_completions + 1
    assert reason_of(_with(completions=["x"] * n, sender_rewards=[0.0] * n)) == RejectReason.too_many_completions
    n = LIMITS.max_completions
    assert len(decode(_with(completions=["x"] * n, sender_rewards=[0.0] * n), LIMITS).completions) == n


@pytest.mark.parametrize(
    "field, limit",
    [
        ("question", LIMITS.max_question_chars),
        ("answer", LIMITS.max_answer_chars),
        ("swarm", LIMITS.max_string_chars),
        ("model_id", LIMITS.max_string_chars),
        ("reasoning_gym_version", LIMITS.max_string_chars),
    ],
)
def test_field_too_long(field, limit):
    assert decode(_with(**{field: "é" * limit}), LIMITS)  # limits count characters, not bytes
    assert reason_of(_with(**{field: "é" * (limit + 1)})) == RejectReason.field_too_long


def test_completion_and_sender_and_metadata_too_long():
    long = "x" * (LIMITS.max_completion_chars + 1)
    assert reason_of(_with(completions=["ok", long])) == RejectReason.field_too_long
    assert reason_of(_with(sender="1" * (LIMITS.max_string_chars + 1))) == RejectReason.field_too_long
    big_metadata = {f"k{i}": "v" * 100 for i in range(200)}  # ~21 KB of msgpack
    assert reason_of(_with(metadata=big_metadata)) == RejectReason.field_too_long


def test_rejection_detail_is_bounded():
    with pytest.raises(Rejected) as info:
        decode(_with(modality="m" * 10_000), LIMITS)
    assert len(info.value.detail) < 200 and len(str(info.value)) < 250


def test_every_reason_is_a_string_enum():
    names = {r.value for r in RejectReason}
    assert names >= {
        "oversized", "bad_frame", "bad_compression", "bad_msgpack", "bad_schema",
        "unknown_schema_version", "unknown_modality", "unknown_dataset", "config_out_of_range",
        "too_many_completions", "field_too_long", "spoofed_answer_key", "unverifiable_version",
        "sender_mismatch", "duplicate", "stale", "peer_quota",
    }  # fmt: skip
    assert all(r == r.value for r in RejectReason)


def test_sample_message_is_valid():
    assert decode(encode(sample_message()), LIMITS).sender == SAMPLE_SENDER
    assert SCHEMA_VERSION == 1


# --- fuzz -----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile_frames())
def test_decode_only_returns_a_message_or_rejected(frame):
    try:
        msg = decode(frame, LIMITS)
    except Rejected as exc:
        assert isinstance(exc.reason, RejectReason)
        return
    assert isinstance(msg, RolloutGroup)
    assert decode(encode(msg), LIMITS) == msg


# written by release 0.2.0's own code: the `behavior` field inside the group, read but no longer written
GOLDEN_BEHAVIOR = pathlib.Path(__file__).parent / "golden" / "0.2.0" / "rollout_group_v1_behavior.bin"


def golden_message_with_behavior() -> RolloutGroup:
    """The golden message with the optional `behavior` field. Never edit (see golden_message)."""
    return golden_message().model_copy(
        update={
            "behavior": BehaviorLogprobs(
                tokenizer="9f2c4e1a7b3d5f60",
                temperature=1.0,
                token_logprobs=[[-0.5, -0.25, 0.0], [-1.5], [-2.0, -0.125]],
            )
        }
    )


def test_golden_bytes_with_the_optional_behavior_field():
    frame = encode(golden_message_with_behavior(), compress=False)
    assert frame == GOLDEN_BEHAVIOR.read_bytes()
    assert decode(frame, LIMITS) == golden_message_with_behavior()
    obj = msgpack.unpackb(frame[1:], raw=False)
    assert list(obj) == sorted(obj) and list(obj["behavior"]) == ["temperature", "token_logprobs", "tokenizer"]


def test_behavior_must_match_the_completions_and_be_log_probabilities():
    base = golden_message_with_behavior().model_dump()
    one_row_short = base | {"behavior": base["behavior"] | {"token_logprobs": [[-0.5]]}}
    positive = base | {"behavior": base["behavior"] | {"token_logprobs": [[0.5], [-1.0], [-1.0]]}}
    for bad in (one_row_short, positive):
        frame = bytes([0]) + msgpack.packb(bad, use_bin_type=True)
        assert reason_of(frame) == RejectReason.bad_schema
