"""Write the golden frames of one release, with that release's own code.

Run it with the Python of an installed release, e.g. for 0.1.0 (CHANGELOG.md names its commit):

    git worktree add --detach /tmp/sapo-0.1.0 36e7e26
    python -m venv /tmp/venv-0.1.0 && /tmp/venv-0.1.0/bin/pip install /tmp/sapo-0.1.0
    /tmp/venv-0.1.0/bin/python tests/protocol/golden/generate.py tests/protocol/golden/0.1.0

It writes every frame that release sends (it looks at what the release's modules offer, so the
same script serves every release) and nothing else. The messages below are the golden ones:
never edit them, add new ones. tests/protocol/test_compatibility.py decodes every file, of every
release, with the code of today.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from types import ModuleType

SENDER = "12D3KooWGzh6X5bXvYJXyVWuXWoMf1Mhj6D6qVuYzjXfYqZ3nW9E"

GROUP = {
    "schema_version": 1,
    "sender": SENDER,
    "swarm": "sapo-golden",
    "sender_round": 12,
    "created_at": 1_735_689_600.5,
    "modality": "text",
    "problem": {
        "dataset": "basic_arithmetic",
        # deliberately out of key order: the encoder must sort map keys
        "config": {"operators": ["+", "-"], "min_terms": 2, "max_terms": 2, "allow_negation": False},
        "seed": 1234,
        "index": 5,
    },
    "question": "Calculate 3 + 4 =",
    "answer": "7",
    "metadata": {"source_index": 5, "source_dataset": "basic_arithmetic", "difficulty": {"num_terms": [2, 2]}},
    "model_id": "SmolLM2-135M-Instruct",
    "completions": ["3 plus 4 is 7. <answer>7</answer>", "<answer>8</answer>", "Ünïcödé ✓ 🙂"],
    "sender_rewards": [1.0, 0.0, 0.0],
    "reasoning_gym_version": "0.1.25",
}
BEHAVIOR = {
    "tokenizer": "9f2c4e1a7b3d5f60",
    "temperature": 1.0,
    "token_logprobs": [[-0.5, -0.25, 0.0], [-1.5], [-2.0, -0.125]],
}
JUDGE_PEER = "12D3KooWNw6rsRXB6edCW9pgnkqhCwnuj8civPt8wWknGw4x6Ak2"
JUDGE = {
    "eval_request": {
        "peer_id": JUDGE_PEER,
        "model_id": "tiny",
        "node_round": 7,
        "swarm_peers_seen": 2,
        "external_groups": 3,
    },
    "question": {
        "id": "0123456789abcdef",
        "task": "basic_arithmetic",
        "question": "Calculate 3 + 4 =",
        "spec": GROUP["problem"],
    },
    "answer": {"id": "0123456789abcdef", "text": "<answer>7</answer>"},
    "score": {"id": "0123456789abcdef", "score": 1.0},
    "error": {"reason": "bad_schema", "detail": "answer: field required"},
}
# Judge wire v2 (0.3.0 on, issue #29): the question without the spec that regenerates its answer.
JUDGE_V2 = {**JUDGE, "question": {k: v for k, v in JUDGE["question"].items() if k != "spec"}}


def wire_module(name: str) -> ModuleType:
    """A module of the release being run's wire: in protocol/wire/ (0.4.0 on, issue #40) or, before,
    at protocol/'s top."""
    try:
        return importlib.import_module(f"sapo.protocol.wire.{name}")
    except ModuleNotFoundError:
        return importlib.import_module(f"sapo.protocol.{name}")


def rollout_frames() -> dict[str, bytes]:
    messages = wire_module("messages")
    codec = wire_module("codec")
    encode = codec.encode

    out = {"rollout_group_v1.bin": encode(messages.RolloutGroup.model_validate(GROUP), compress=False)}
    if "behavior" in inspect.signature(messages.to_wire).parameters:  # 0.2.0 sent it inside the group
        group = messages.RolloutGroup.model_validate({**GROUP, "behavior": BEHAVIOR})
        out["rollout_group_v1_behavior.bin"] = encode(group, compress=False)
    if hasattr(messages, "SharedLogprobs"):  # 0.3.0 on: its own message, on its own topic
        encode_logprobs, group_digest = codec.encode_logprobs, codec.group_digest

        digest = group_digest(messages.RolloutGroup.model_validate(GROUP)).hex()
        shared = messages.SharedLogprobs.model_validate(
            {
                "schema_version": 1,
                "sender": SENDER,
                "swarm": "sapo-golden",
                "created_at": 1_735_689_600.25,
                "groups": [{"group": digest, "behavior": BEHAVIOR}],
            }
        )
        out["shared_logprobs_v1.bin"] = encode_logprobs(shared, compress=False)
    return out


def discovery_frames() -> dict[str, bytes]:
    """/sapo/peers/1: a request and a response, around a record sealed with a fixed key (seq 1)."""
    import multiaddr
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.envelope import seal_record
    from libp2p.peer.id import ID
    from libp2p.peer.peer_record import PeerRecord

    try:
        records = wire_module("peer_records")
    except ModuleNotFoundError:  # 0.1.0 kept them in discovery.py
        records = importlib.import_module("sapo.protocol.discovery")
    encode_request, encode_response = records.encode_request, records.encode_response
    key = create_new_key_pair(b"\x07" * 32)
    record = PeerRecord(ID.from_pubkey(key.public_key), [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/4001")], seq=1)
    envelope = seal_record(record, key.private_key).marshal_envelope()
    return {
        "peers_request_v1.bin": encode_request(envelope),
        "peers_response_v1.bin": encode_response(envelope, [(envelope, "10.0.0.1"), (envelope, None)]),
    }


def group_fetch_frames() -> dict[str, bytes]:
    """/sapo/groups/1 (from 0.4.0): a request and a response carrying the golden group frame."""
    try:
        group_wire = wire_module("group_wire")
    except ModuleNotFoundError:  # before 0.4.0 groups only travelled on the topic
        return {}
    request = group_wire.GroupRequest("golden", after=6, max_groups=2)
    group = rollout_frames()["rollout_group_v1.bin"]
    return {
        "groups_request_v1.bin": group_wire.encode_request(request),
        "groups_response_v1.bin": group_wire.encode_response([group_wire.ServedGroup(7, group)]),
    }


def judge_frames() -> dict[str, bytes]:
    judge_wire = wire_module("judge_wire")

    kinds = {
        "eval_request": judge_wire.EvalRequest,
        "question": judge_wire.Question,
        "answer": judge_wire.Answer,
        "score": judge_wire.Score,
        "error": judge_wire.JudgeError,
    }
    version = getattr(judge_wire, "JUDGE_SCHEMA_VERSION", 1)
    messages = JUDGE if version == 1 else JUDGE_V2
    out = {
        f"judge_{kind}_v{version}.bin": judge_wire.encode(kinds[kind].model_validate(fields))
        for kind, fields in messages.items()
    }
    if hasattr(judge_wire, "RetiredVersionRefusal"):  # v2 judges still tell v1 nodes why, in v1
        out["judge_error_v1.bin"] = judge_wire.encode(judge_wire.RetiredVersionRefusal.model_validate(JUDGE["error"]))
    return out


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    frames = {**rollout_frames(), **discovery_frames(), **group_fetch_frames(), **judge_frames()}
    for name, frame in frames.items():
        (out / name).write_bytes(frame)
        print(f"{out / name}: {len(frame)} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/protocol/golden/generate.py OUT_DIR")
    main(Path(sys.argv[1]))
