"""The wire contract across releases (protocol/README.md, "Compatibility"):

- every golden frame of every release (tests/protocol/golden/<version>/, written by that release's
  own code) decodes with today's code, to the message it was made from;
- what this release sends to the rollouts topic is byte for byte what 0.1.0 sent, shared
  log-probs or not, so a 0.1.0 reader never meets a field it refuses;
- a field this release does not know is skipped, within the decoder's bounds: a frame that an
  unknown field pushes past them is still refused.
"""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack
import pytest

from sapo.node.core.exchange import GroupEncoder
from sapo.protocol.toolkit.release import sapo_version
from sapo.protocol.wire import group_wire, judge_wire
from sapo.protocol.wire.codec import DecodeLimits, decode, decode_logprobs, encode, group_digest
from sapo.protocol.wire.messages import BehaviorLogprobs, Rejected, RejectReason, RolloutGroup
from sapo.protocol.wire.peer_records import check_record, decode_request, decode_response
from sapo.training.problems.rollouts import Behavior
from sapo.training.problems.tasks import generate_problem
from tests.protocol.golden.generate import BEHAVIOR, GROUP, JUDGE, JUDGE_V2
from tests.support.releases import released

GOLDEN = Path(__file__).parent / "golden"
LIMITS = DecodeLimits()
JUDGE_KINDS = {
    "eval_request": judge_wire.EvalRequest,
    "question": judge_wire.Question,
    "answer": judge_wire.Answer,
    "score": judge_wire.Score,
    "error": judge_wire.JudgeError,
}


def golden_frames() -> list[tuple[str, Path]]:
    return sorted((path.parent.name, path) for path in GOLDEN.glob("*/*.bin"))


def test_every_release_has_its_golden_frames():
    releases = set(released()) | {sapo_version()}  # the release being made has no commit yet
    assert {path.parent.name for path in GOLDEN.glob("*/*.bin")} == releases


@pytest.mark.parametrize("release, path", golden_frames(), ids=lambda v: v.name if isinstance(v, Path) else v)
def test_every_golden_frame_of_every_release_decodes(release, path):
    frame, name = path.read_bytes(), path.name
    group = RolloutGroup.model_validate(GROUP)
    if name == "rollout_group_v1.bin":
        assert decode(frame, LIMITS) == group
    elif name == "rollout_group_v1_behavior.bin":
        assert decode(frame, LIMITS) == group.model_copy(update={"behavior": BehaviorLogprobs.model_validate(BEHAVIOR)})
    elif name == "shared_logprobs_v1.bin":
        shared = decode_logprobs(frame, LIMITS)
        assert shared.sender == group.sender and [e.group for e in shared.groups] == [group_digest(group).hex()]
        assert shared.groups[0].behavior == BehaviorLogprobs.model_validate(BEHAVIOR)
    elif name == "peers_request_v1.bin":
        assert check_record(decode_request(frame[4:]), None).addrs
    elif name == "peers_response_v1.bin":
        own, peers = decode_response(frame[4:])
        assert check_record(own, None).peer_id == check_record(peers[1][0], peers[1][1]).peer_id
        assert [ip for _, ip in peers] == ["10.0.0.1", None]
    elif name == "groups_request_v1.bin":
        assert group_wire.decode_request(frame[4:]) == group_wire.GroupRequest("golden", after=6, max_groups=2)
    elif name == "groups_response_v1.bin":
        request = group_wire.GroupRequest("golden", after=6, max_groups=2)
        [served] = group_wire.decode_response(frame[4:], request, LIMITS.max_message_bytes)
        assert served.round_index == 7 and decode(served.frame, LIMITS) == group
    elif name.startswith("judge_") and name.endswith("_v2.bin"):
        kind = name.removeprefix("judge_").removesuffix("_v2.bin")
        assert judge_wire.decode(frame, JUDGE_KINDS[kind]) == JUDGE_KINDS[kind].model_validate(JUDGE_V2[kind])
    elif name.startswith("judge_") and name.endswith("_v1.bin"):
        # Judge wire v1 is retired (its questions gave away the answer, issue #29; CHANGELOG 0.3.0):
        # each frame is recognised and refused with a reason the peer can act on, and an old
        # judge's error frame is shown in its own words.
        kind = name.removeprefix("judge_").removesuffix("_v1.bin")
        with pytest.raises(judge_wire.JudgeWireError) as refused:
            judge_wire.decode(frame, JUDGE_KINDS[kind] if kind != "error" else judge_wire.Question)
        assert refused.value.reason is judge_wire.WireErrorReason.retired_schema_version
        assert "upgrade" in refused.value.detail
        if kind == "error":
            assert f"the judge refused: {JUDGE['error']['reason']}: {JUDGE['error']['detail']}" in refused.value.detail
    else:
        pytest.fail(f"{path}: a golden frame no test decodes; add it here")


def test_a_frame_means_the_same_bytes_in_every_release_that_sends_it():
    by_name: dict[str, set[bytes]] = {}
    for _, path in golden_frames():
        by_name.setdefault(path.name, set()).add(path.read_bytes())
    assert all(len(frames) == 1 for frames in by_name.values()), {n: len(f) for n, f in by_name.items()}


def test_what_this_release_publishes_as_a_group_is_what_0_1_0_wrote_logprobs_or_not():
    problem = generate_problem(RolloutGroup.model_validate(GROUP).problem.to_spec())
    from sapo.training.problems.rollouts import QuestionGroup

    group = QuestionGroup(
        problem=problem,
        completions=GROUP["completions"],
        rewards=GROUP["sender_rewards"],
        behavior=Behavior(**BEHAVIOR),
    )
    encoder = GroupEncoder(
        peer_id=GROUP["sender"],
        swarm=GROUP["swarm"],
        model_id=GROUP["model_id"],
        rg_version=GROUP["reasoning_gym_version"],
        compress=False,
        share_logprobs=True,
        clock=lambda: GROUP["created_at"],
    )
    outgoing = encoder.frames([group], GROUP["sender_round"])
    # the group frame holds exactly 0.1.0's fields (its metadata is the regenerated problem's)
    sent = msgpack.unpackb(outgoing.groups[0][1:], raw=False)
    assert set(sent) == set(msgpack.unpackb((GOLDEN / "0.1.0" / "rollout_group_v1.bin").read_bytes()[1:], raw=False))
    assert encode(decode(outgoing.groups[0], LIMITS), compress=False) == outgoing.groups[0]
    # the log-probs went apart, naming the group
    shared = decode_logprobs(outgoing.logprobs[0], LIMITS)
    assert shared.groups[0].group == group_digest(decode(outgoing.groups[0], LIMITS)).hex()


# --- what a reader does with a field it does not know ----------------------------------------


def frame_of(obj) -> bytes:
    return b"\x00" + msgpack.packb(obj, use_bin_type=True)


def test_an_unknown_optional_field_is_skipped_wherever_it_is():
    group = RolloutGroup.model_validate(GROUP)
    later = {
        **GROUP,
        "reviewer_note": {"by": "a later release", "scores": [[0.5, 1.0]]},
        "problem": {**GROUP["problem"], "generator_build": "2027.1"},
    }
    assert decode(frame_of(later), LIMITS) == group
    with_behavior = {**GROUP, "behavior": {**BEHAVIOR, "top_k": 5}}
    assert decode(frame_of(with_behavior), LIMITS).behavior == BehaviorLogprobs.model_validate(BEHAVIOR)
    shared = msgpack.unpackb((GOLDEN / "0.3.0" / "shared_logprobs_v1.bin").read_bytes()[1:], raw=False)
    shared["compression"] = "none"
    shared["groups"][0]["rows"] = 3
    assert decode_logprobs(frame_of(shared), LIMITS).groups[0].behavior == BehaviorLogprobs.model_validate(BEHAVIOR)


def test_an_unknown_field_past_the_decoders_bounds_is_still_refused():
    deep: object = 1
    for _ in range(LIMITS.max_nesting + 1):
        deep = [deep]
    cases = [
        ({**GROUP, "later": deep}, RejectReason.too_deep),
        ({**GROUP, "problem": {**GROUP["problem"], "later": deep}}, RejectReason.too_deep),
        ({**GROUP, "later": "x" * LIMITS.max_message_bytes}, RejectReason.oversized),
        ({**GROUP, "later": list(range(LIMITS.max_container_items + 1))}, RejectReason.bad_msgpack),
        ({**GROUP, "later": b"\x00" * 10}, RejectReason.bad_msgpack),  # no binary, known field or not
        ({**GROUP, 7: "an int key"}, RejectReason.bad_msgpack),
    ]
    for obj, reason in cases:
        with pytest.raises(Rejected) as refused:
            decode(frame_of(obj), LIMITS)
        assert refused.value.reason is reason, (list(obj)[-1], refused.value)
    # a known field keeps its own rules: skipping applies to unknown names only
    with pytest.raises(Rejected) as refused:
        decode(frame_of({**GROUP, "sender_round": "12"}), LIMITS)
    assert refused.value.reason is RejectReason.bad_schema


def test_an_unknown_field_in_a_judge_or_discovery_frame_is_skipped():
    request = {
        **JUDGE["eval_request"],
        "kind": "eval_request",
        "schema_version": judge_wire.JUDGE_SCHEMA_VERSION,
        "later": [1, 2],
    }
    payload = msgpack.packb(request, use_bin_type=True)
    decoded = judge_wire.decode(struct.pack(">I", len(payload)) + payload, judge_wire.EvalRequest)
    assert decoded == judge_wire.EvalRequest.model_validate(JUDGE["eval_request"])
    frame = (GOLDEN / "0.1.0" / "peers_request_v1.bin").read_bytes()
    obj = msgpack.unpackb(frame[4:], raw=False)
    assert decode_request(msgpack.packb({**obj, "later": 1}, use_bin_type=True)) == obj["self"]
