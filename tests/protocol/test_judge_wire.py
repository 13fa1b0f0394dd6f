"""The judge wire: round trips, golden bytes, and every malformed frame refused with its reason."""

import struct

import msgpack
import pytest

from sapo.protocol.wire import judge_wire as wire
from sapo.protocol.wire.judge_wire import (
    Answer,
    EvalRequest,
    JudgeError,
    JudgeWireError,
    Question,
    Score,
    WireErrorReason,
)

PEER = "12D3KooWNw6rsRXB6edCW9pgnkqhCwnuj8civPt8wWknGw4x6Ak2"
QID = "0123456789abcdef"


def request(**overrides):
    fields = dict(peer_id=PEER, model_id="tiny", node_round=7, swarm_peers_seen=2, external_groups=3)
    return EvalRequest(**{**fields, **overrides})


def question():
    return Question(id=QID, task="basic_arithmetic", question="What is 2 + 3?")


@pytest.mark.parametrize(
    "msg, kind",
    [
        (request(), EvalRequest),
        (question(), Question),
        (Answer(id=QID, text="2 + 3 = 5 <answer>5</answer>"), Answer),
        (Score(id=QID, score=0.5), Score),
        (JudgeError(reason="bad_schema", detail="node_round: too big"), JudgeError),
    ],
)
def test_every_message_round_trips(msg, kind):
    assert wire.decode(wire.encode(msg), kind) == msg


def test_golden_bytes_of_an_eval_request():
    # The contract: 4-byte big-endian length, then a msgpack map with sorted keys.
    frame = wire.encode(request())
    payload = msgpack.packb(
        {
            "external_groups": 3,
            "kind": "eval_request",
            "model_id": "tiny",
            "node_round": 7,
            "peer_id": PEER,
            "schema_version": 2,
            "swarm_peers_seen": 2,
        },
        use_bin_type=True,
    )
    assert frame == struct.pack(">I", len(payload)) + payload
    assert frame.hex() == (
        "0000009e87af65787465726e616c5f67726f75707303a46b696e64ac6576616c5f72657175657374a86d6f64656c5f6964"
        "a474696e79aa6e6f64655f726f756e6407a7706565725f6964d934313244334b6f6f574e7736727352584236656443573970"
        "676e6b716843776e756a3863697650743877576b6e4777347836416b32ae736368656d615f76657273696f6e02b073776172"
        "6d5f70656572735f7365656e02"
    )


def frame_of(obj) -> bytes:
    payload = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(payload)) + payload


GOOD = request().model_dump(mode="json")


@pytest.mark.parametrize(
    "frame, reason",
    [
        (b"\x00\x00", WireErrorReason.truncated),
        (struct.pack(">I", 10) + b"abc", WireErrorReason.truncated),
        (struct.pack(">I", wire.MAX_FRAME_BYTES + 1), WireErrorReason.oversized),
        (struct.pack(">I", 0), WireErrorReason.empty),
        (struct.pack(">I", 1) + b"\xc1", WireErrorReason.bad_msgpack),  # 0xc1 is never valid
        (struct.pack(">I", 2) + b"\x01\x02", WireErrorReason.bad_msgpack),  # trailing bytes
        (frame_of([1, 2, 3]), WireErrorReason.bad_schema),
        (frame_of({k: v for k, v in GOOD.items() if k != "schema_version"}), WireErrorReason.bad_schema),
        (frame_of({**GOOD, "schema_version": True}), WireErrorReason.bad_schema),
        (frame_of({**GOOD, "schema_version": 3}), WireErrorReason.unknown_schema_version),
        (frame_of({**GOOD, "schema_version": 1}), WireErrorReason.retired_schema_version),
        (frame_of({**GOOD, "kind": "answer"}), WireErrorReason.unexpected_kind),
        (frame_of({**GOOD, "node_round": -1}), WireErrorReason.bad_schema),
        (frame_of({**GOOD, "node_round": 1.0}), WireErrorReason.bad_schema),
        (frame_of({**GOOD, "peer_id": "not/base58!"}), WireErrorReason.bad_schema),
        (frame_of({**GOOD, "model_id": b"bytes"}), WireErrorReason.bad_msgpack),  # no bin type allowed
    ],
)
def test_malformed_eval_requests_are_refused_with_a_named_reason(frame, reason):
    with pytest.raises(JudgeWireError) as caught:
        wire.decode(frame, EvalRequest)
    assert caught.value.reason is reason
    assert caught.value.detail


def test_a_field_a_later_release_adds_is_skipped():
    # protocol/README.md, "Compatibility": readers skip what they do not know, within the frame's bounds
    assert wire.decode(frame_of({**GOOD, "later": {"x": [1, 2]}}), EvalRequest) == request()
    with pytest.raises(JudgeWireError) as caught:
        wire.decode(frame_of({**GOOD, "later": "x" * wire.MAX_FRAME_BYTES}), EvalRequest)
    assert caught.value.reason is WireErrorReason.oversized


def test_a_score_outside_zero_one_is_refused():
    with pytest.raises(JudgeWireError, match="bad_schema: score"):
        wire.decode(frame_of({**Score(id=QID, score=1.0).model_dump(mode="json"), "score": 1.5}), Score)


def test_the_judges_error_frame_surfaces_its_message():
    frame = wire.encode(JudgeError(reason="peer_mismatch", detail="send your own peer id"))
    with pytest.raises(JudgeWireError, match="the judge refused: peer_mismatch: send your own peer id"):
        wire.decode(frame, Question)


def test_encode_refuses_an_oversized_message():
    with pytest.raises(ValueError, match="frame limit"):
        wire.encode(Answer(id=QID, text="x" * 2000), max_frame_bytes=1024)


class FakeStream:
    def __init__(self, data: bytes, chunk: int = 3):
        self.data, self.chunk, self.reads = data, chunk, 0
        self.written = b""

    async def read(self, n=None):
        self.reads += 1
        out, self.data = self.data[: min(n, self.chunk)], self.data[min(n, self.chunk) :]
        return out

    async def write(self, data):
        self.written += data


async def test_read_message_reassembles_small_reads():
    stream = FakeStream(wire.encode(question()) + b"next", chunk=3)
    assert await wire.read_message(stream, Question) == question()
    assert stream.data == b"next"  # exactly one frame consumed


async def test_read_message_checks_the_length_before_reading_the_payload():
    stream = FakeStream(struct.pack(">I", 2**31) + b"x" * 100, chunk=100)
    with pytest.raises(JudgeWireError) as caught:
        await wire.read_message(stream, EvalRequest)
    assert caught.value.reason is WireErrorReason.oversized
    assert stream.reads == 1 and len(stream.data) == 100


async def test_read_message_on_a_closed_stream_is_truncated():
    with pytest.raises(JudgeWireError) as caught:
        await wire.read_message(FakeStream(wire.encode(request())[:-5]), EvalRequest)
    assert caught.value.reason is WireErrorReason.truncated


# --- judge wire v1 is retired: its questions carried the spec that regenerates the answer (#29) --


def test_a_question_carries_nothing_that_rebuilds_its_answer():
    assert set(question().model_dump()) == {"schema_version", "kind", "id", "task", "question"}


def test_a_v1_frame_is_refused_as_retired_with_what_to_do():
    v1_question = {
        **question().model_dump(mode="json"),
        "schema_version": 1,
        "spec": {"dataset": "basic_arithmetic", "config": {}, "seed": 5, "index": 9},
    }
    with pytest.raises(JudgeWireError) as caught:
        wire.decode(frame_of(v1_question), Question)
    assert caught.value.reason is WireErrorReason.retired_schema_version
    assert "upgrade" in caught.value.detail and "issue #29" in caught.value.detail


def test_an_old_judges_refusal_is_shown_in_its_own_words():
    # what a 0.1.0/0.2.0 judge answers our v2 EvalRequest
    old = {
        "schema_version": 1,
        "kind": "error",
        "reason": "unknown_schema_version",
        "detail": "schema_version 2, this side speaks 1",
    }
    with pytest.raises(JudgeWireError, match="the judge refused: unknown_schema_version: schema_version 2") as caught:
        wire.decode(frame_of(old), Question)
    assert caught.value.reason is WireErrorReason.retired_schema_version


def test_the_refusal_to_a_v1_peer_is_a_v1_error_frame():
    frame = wire.encode(wire.RetiredVersionRefusal(reason="retired_schema_version", detail="upgrade"))
    payload = msgpack.unpackb(frame[4:], raw=False)
    assert payload == {"detail": "upgrade", "kind": "error", "reason": "retired_schema_version", "schema_version": 1}
