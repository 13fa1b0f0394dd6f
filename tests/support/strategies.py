"""Hypothesis strategies for the wire codec, shared by the tests and by bench scripts.

`hostile_frames()` is what the decoder must survive: random bytes, truncated and mutated valid
frames, deep nesting, msgpack headers that declare 2**32 elements, wrong types, NaN/inf, invalid
UTF-8, unknown schema versions, out-of-range configs and zlib bombs. The only acceptable outcome
of `decode` on any of them is a RolloutGroup or `Rejected`.

A bench can run many more cases than the test suite, e.g.:

    from tests.support.strategies import hostile_frames
    @settings(max_examples=100_000, deadline=None) @given(hostile_frames()) ...
"""

from __future__ import annotations

import copy
import math
import zlib
from typing import Any

import msgpack
from hypothesis import strategies as st

from sapo.protocol.wire.codec import encode
from sapo.protocol.wire.messages import SCHEMA_VERSION, RolloutGroup, WireProblemSpec
from sapo.training.problems.tasks import EASY_CONFIGS

BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
SAMPLE_SENDER = "12D3KooWGzh6X5bXvYJXyVWuXWoMf1Mhj6D6qVuYzjXfYqZ3nW9E"


def sample_message(**overrides: Any) -> RolloutGroup:
    """A small valid message (it passes decode; the answer key is not a real one)."""
    fields: dict[str, Any] = dict(
        schema_version=SCHEMA_VERSION,
        sender=SAMPLE_SENDER,
        swarm="sapo-test",
        sender_round=3,
        created_at=1_700_000_000.25,
        modality="text",
        problem=WireProblemSpec(
            dataset="basic_arithmetic", config=dict(EASY_CONFIGS["basic_arithmetic"]), seed=42, index=7
        ),
        question="What is 3 + 4?",
        answer="7",
        metadata={"source_dataset": "basic_arithmetic", "num_terms": 2},
        model_id="SmolLM2-135M-Instruct",
        completions=["<answer>7</answer>", "<answer>8</answer>"],
        sender_rewards=[1.0, 0.0],
        reasoning_gym_version="0.1.25",
    )
    fields.update(overrides)
    return RolloutGroup(**fields)


def message_dict(msg: RolloutGroup | None = None) -> dict[str, Any]:
    """The plain map that goes on the wire, to tamper with."""
    return (msg or sample_message()).model_dump(mode="json")


def frame_of(obj: Any, compress: bool = False) -> bytes:
    """Frame an arbitrary object, bypassing the schema, as a hostile peer would."""
    payload = msgpack.packb(obj, use_bin_type=True)
    if compress:
        return b"\x01" + zlib.compress(payload)
    return b"\x00" + payload


# --- valid messages -------------------------------------------------------------------------

_text = st.text(max_size=200)
_finite = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)
_json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
_json_value = st.recursive(
    _json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=20,
)


@st.composite
def rollout_groups(draw: st.DrawFn) -> RolloutGroup:
    """Valid messages: every one of them must decode back to itself."""
    dataset = draw(st.sampled_from(sorted(EASY_CONFIGS)))
    completions = draw(st.lists(st.text(max_size=300), min_size=1, max_size=8))
    rewards = draw(
        st.lists(
            st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
            min_size=len(completions),
            max_size=len(completions),
        )
    )
    return RolloutGroup(
        schema_version=SCHEMA_VERSION,
        sender=draw(st.text(alphabet=BASE58, min_size=1, max_size=60)),
        swarm=draw(st.text(min_size=1, max_size=40)),
        sender_round=draw(st.integers(min_value=0, max_value=2**63 - 1)),
        created_at=draw(_finite),
        modality="text",
        problem=WireProblemSpec(
            dataset=dataset,
            config=dict(EASY_CONFIGS[dataset]),
            seed=draw(st.integers(min_value=0, max_value=2**63 - 1)),
            index=draw(st.integers(min_value=0, max_value=2**31 - 1)),
        ),
        question=draw(_text),
        answer=draw(st.text(max_size=50)),
        metadata=draw(st.dictionaries(st.text(max_size=10), _json_value, max_size=5)),
        model_id=draw(st.text(max_size=40)),
        completions=completions,
        sender_rewards=rewards,
        reasoning_gym_version=draw(st.sampled_from(["0.1.25", "0.1.24", "9.9.9"])),
    )


@st.composite
def valid_frames(draw: st.DrawFn) -> bytes:
    return encode(draw(rollout_groups()), compress=draw(st.booleans()))


# --- hostile frames -------------------------------------------------------------------------

_WEIRD_VALUES = st.one_of(
    st.sampled_from(
        [
            math.nan,
            math.inf,
            -math.inf,
            -1,
            2**64 - 1,
            -(2**63),
            True,
            False,
            None,
            b"bytes",
            [],
            {},
            [[[]]],
            {"k": {"k": {}}},
            "",
            "x" * 70_000,
            1.5,
            0,
        ]
    ),
    _json_value,
)

_TOP_KEYS = list(message_dict().keys())
_PROBLEM_KEYS = ["dataset", "config", "seed", "index"]

_BAD_CONFIGS = st.sampled_from(
    [
        ("base_conversion", {"min_base": 16, "max_base": 16}),  # loops forever in the generator
        ("base_conversion", {"max_value": 10**12}),
        ("basic_arithmetic", {"max_digits": 1000}),
        ("basic_arithmetic", {"operators": ["**"]}),
        ("basic_arithmetic", {"operators": ["+"] * 10_000}),
        ("basic_arithmetic", {"seed": 3}),
        ("propositional_logic", {"max_vars": 30}),
        ("binary_matrix", {"max_n": 10_000}),
        ("binary_matrix", {"p_zero": math.nan}),
        ("bf", {"difficulty": 0}),
        ("bf", {"difficulty": True}),
        ("calendar_arithmetic", {"year": 9999, "offset_upper_bound": 10**6}),
        ("decimal_arithmetic", {"precision": 10**6}),
        ("arc_1d", {"max_size": 10**5}),
        ("fraction_simplification", {"styles": []}),
        ("leg_counting", {}),
        ("", {}),
    ]
)


@st.composite
def _tampered_maps(draw: st.DrawFn) -> bytes:
    """A valid message's map with one or more fields broken, then framed."""
    obj = copy.deepcopy(message_dict(draw(rollout_groups())))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        kind = draw(
            st.sampled_from(["set", "drop", "extra", "version", "modality", "problem", "config", "nest", "count"])
        )
        if kind == "set":
            obj[draw(st.sampled_from(_TOP_KEYS))] = draw(_WEIRD_VALUES)
        elif kind == "drop":
            obj.pop(draw(st.sampled_from(_TOP_KEYS)), None)
        elif kind == "extra":
            obj[draw(st.text(max_size=20))] = draw(_WEIRD_VALUES)
        elif kind == "version":
            obj["schema_version"] = draw(st.one_of(st.integers(min_value=-(2**63), max_value=2**64 - 1), _WEIRD_VALUES))
        elif kind == "modality":
            obj["modality"] = draw(st.one_of(st.text(max_size=20), _WEIRD_VALUES))
        elif kind == "problem" and isinstance(obj.get("problem"), dict):
            obj["problem"][draw(st.sampled_from(_PROBLEM_KEYS))] = draw(_WEIRD_VALUES)
        elif kind == "config" and isinstance(obj.get("problem"), dict):
            dataset, config = draw(_BAD_CONFIGS)
            obj["problem"]["dataset"] = dataset
            obj["problem"]["config"] = config
        elif kind == "nest":
            depth = draw(st.integers(min_value=1, max_value=200))
            nested: Any = 0
            for _ in range(depth):
                nested = [nested] if draw(st.booleans()) else {"k": nested}
            obj[draw(st.sampled_from(["metadata", "completions", "question"]))] = nested
        elif kind == "count":
            n = draw(st.sampled_from([0, 65, 1000]))
            obj["completions"] = ["x"] * n
            obj["sender_rewards"] = [0.0] * draw(st.sampled_from([n, n + 1]))
    try:
        return frame_of(obj, compress=draw(st.booleans()))
    except (OverflowError, ValueError, TypeError):  # something msgpack itself cannot pack
        return b"\x00"


@st.composite
def _truncated(draw: st.DrawFn) -> bytes:
    frame = draw(valid_frames())
    return frame[: draw(st.integers(min_value=0, max_value=len(frame) - 1))]


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    frame = bytearray(draw(valid_frames()))
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        pos = draw(st.integers(min_value=0, max_value=max(0, len(frame) - 1)))
        if op == "flip" and frame:
            frame[pos] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif op == "set" and frame:
            frame[pos] = draw(st.integers(min_value=0, max_value=255))
        elif op == "insert":
            frame[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and frame:
            del frame[pos : pos + draw(st.integers(min_value=1, max_value=8))]
    return bytes(frame)


# msgpack headers that claim far more data than follows: arrays/maps of 2**32-1 entries, 4 GiB
# strings, binaries and ext payloads.
_HUGE_HEADERS = [
    b"\xdd\xff\xff\xff\xff",  # array32
    b"\xdf\xff\xff\xff\xff",  # map32
    b"\xdc\xff\xff",  # array16
    b"\xde\xff\xff",  # map16
    b"\xdb\xff\xff\xff\xff",  # str32
    b"\xc6\xff\xff\xff\xff",  # bin32
    b"\xc9\xff\xff\xff\xff\x01",  # ext32
    b"\xd6\xff\x00\x00\x00\x00",  # timestamp ext
]


@st.composite
def _huge_declared(draw: st.DrawFn) -> bytes:
    header = draw(st.sampled_from(_HUGE_HEADERS))
    tail = draw(st.binary(max_size=16))
    where = draw(st.sampled_from(["top", "in_map", "in_completions"]))
    if where == "top":
        payload = header + tail
    elif where == "in_map":
        payload = b"\x81\xa8metadata" + header + tail
    else:
        payload = b"\x82\xaemodality\xa4text\xabcompletions" + header + tail
    return b"\x00" + payload


@st.composite
def _bad_utf8(draw: st.DrawFn) -> bytes:
    """A valid message where one string's bytes are replaced by invalid UTF-8 of the same length."""
    marker = "\x01MARKER\x01"
    field = draw(st.sampled_from(["question", "answer", "swarm", "model_id"]))
    obj = message_dict()
    obj[field] = marker
    payload = msgpack.packb(obj, use_bin_type=True)
    garbage = draw(st.sampled_from([b"\xff" * 8, b"\xc3\x28" * 4, b"\xed\xa0\x80\x00" * 2]))
    return b"\x00" + payload.replace(marker.encode(), garbage, 1)


def _deep_raw(depth: int) -> bytes:
    return b"\x00" + b"\x91" * depth + b"\xc0"


_BOMB = b"\x01" + zlib.compress(b"\x00" * (8 * 1024 * 1024), 9)  # 8 MiB of zeros in ~8 KiB


def hostile_frames() -> st.SearchStrategy[bytes]:
    """Everything the decoder must survive (see the module docstring)."""
    return st.one_of(
        st.binary(max_size=512),
        st.tuples(st.sampled_from([0, 1, 2, 0x7F, 0xFF]), st.binary(max_size=256)).map(lambda t: bytes([t[0]]) + t[1]),
        _truncated(),
        _mutated(),
        _tampered_maps(),
        _huge_declared(),
        _bad_utf8(),
        st.integers(min_value=1, max_value=5000).map(_deep_raw),
        st.just(_BOMB),
        st.binary(max_size=256).map(lambda b: b"\x01" + zlib.compress(b)),
        valid_frames(),
    )
