"""Two releases in one swarm, as a rolling upgrade leaves it: a node of the previous release (0.1.0,
installed from this repository's history, tests/releases.py) beside two nodes of this one that
share their log-probs (--share-logprobs) and weigh peers' completions by them.

Every node trains on groups from every other, in both directions; nobody is banned, and no honest
peer's score ever drops below 0 (sampled from the new nodes' status all along; the old node keeps
no score a page shows, so: none of its refusals is one it charges for, nor is any message over its
rate limit). The new nodes' log-probs reach each other and never the old node. Each new node's
status names what every peer runs (its identify's agent string).

Against 0.2.0 as the new side (main before this change, whose --share-logprobs put a field inside
the group that 0.1.0 refuses), this fails: SAPO_UPGRADE_NEW_PYTHON=~/.cache/sapo/releases/0.2.0-723548c/bin/python.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sapo.node.daemon.status import status_from_url
from sapo.protocol.peer_guard import PENALTIES
from sapo.protocol.release import sapo_version
from tests.conftest import sapo_node
from tests.node.daemon.test_page import page_url
from tests.processes import PLUMBING, NodeProcess
from tests.releases import release_python

PREVIOUS = "0.1.0"
NEW_PYTHON = os.environ.get("SAPO_UPGRADE_NEW_PYTHON", sys.executable)
# 0.1.0 keeps every group; the new nodes keep the tiny model's flat ones because they augment (PLUMBING)
OLD_ARGS = ["--local", "2", "--external", "2", "--sampler", "uniform", "--rounds", "0"]
# Only a group whose every completion re-encodes to the tokens sampled shares its log-probs
# (training/generation.py); the untrained tiny model's 24-token rows do in ~1 group of 10, its
# 8-token ones in about half.
NEW_ARGS = [
    *PLUMBING,
    "--max-new-tokens",
    "8",
    "--share-logprobs",
    "--importance-weight",
    "sequence",
    "--metrics-port",
    "0",
]
SETTLE_SECONDS = 150  # every node has trained on every other
WATCH_SECONDS = 20  # and then it stays that way
# What costs a peer score (any refusal charged, or a publish over the rate limit).
CHARGED = {reason for reason, points in PENALTIES.items() if points > 0}


def test_previous_release_and_this_one_train_on_each_other_with_shared_logprobs(tmp_path, nodes):
    old = NodeProcess(tmp_path / "old", OLD_ARGS, python=release_python(PREVIOUS))
    nodes.append(old)
    with ThreadPoolExecutor(2) as starting:  # the new nodes find each other through the old one's peers
        new = [
            starting.submit(NodeProcess, tmp_path / name, [*NEW_ARGS, "--peers", old.address], python=NEW_PYTHON)
            for name in ("new-a", "new-b")
        ]
    nodes.extend(future.result() for future in new if future.exception() is None)  # killed after the test
    a, b = [future.result() for future in new]
    pages = {a: page_url(a), b: page_url(b)}
    everyone = [old, a, b]
    lowest: dict[str, float] = {}  # the lowest score each new node ever gave each peer

    def look() -> bool:
        """Checks what must hold at every moment; True once every node trained on every other."""
        for node in everyone:
            assert node.alive(), f"{node.data_dir.name} died:\n{node.log_text()[-3000:]}"
        rows = {node: node.metrics() for node in everyone}
        charged = {r: n for r, n in (rows[old][-1]["rejected"] if rows[old] else {}).items() if r in CHARGED}
        assert not charged, f"{PREVIOUS} charged the new nodes for {charged}:\n{old.log_text()[-2000:]}"
        joined = True
        for url in pages.values():
            status = status_from_url(url)
            joined = joined and status.logprobs.get("joined", 0) > 0
            for peer in status.peers:
                if peer.score is not None:
                    lowest[peer.peer_id] = min(lowest.get(peer.peer_id, 0.0), peer.score)
        assert all(score >= 0 for score in lowest.values()), f"a peer's score went negative: {lowest}"
        for node in everyone:
            assert not (rows[node] and rows[node][-1]["transport"].get("peers_banned")), (
                f"{node.data_dir.name} banned a peer"
            )
        return joined and all(
            rows[node]
            and all(
                rows[node][-1]["accepted_from"].get(other.peer_id, 0) > 0 for other in everyone if other is not node
            )
            and sum(r["external_groups"] for r in rows[node]) > 0
            for node in everyone
        )

    deadline = time.monotonic() + SETTLE_SECONDS
    while not look():
        assert time.monotonic() < deadline, (
            "not every node trained on every other in time: "
            + "; ".join(
                f"{n.data_dir.name} accepted {n.metrics()[-1]['accepted_from'] if n.metrics() else {}}"
                for n in everyone
            )
            + "; log-probs "
            + "; ".join(str(status_from_url(url).logprobs) for url in pages.values())
        )
        time.sleep(1)
    settled = time.monotonic()
    while time.monotonic() < settled + WATCH_SECONDS:
        look()
        time.sleep(1)

    last = {node: node.metrics()[-1] for node in everyone}
    for name in ("bad_schema", "unknown_schema_version"):
        assert name not in last[old]["rejected"], f"{PREVIOUS} met a frame it cannot read: {last[old]['rejected']}"
    for node, url in pages.items():
        status = status_from_url(url)
        runs = {peer.peer_id: peer.agent for peer in status.peers}
        other = b if node is a else a
        assert runs.get(other.peer_id) == f"sapo/{sapo_version()}", runs
        assert runs.get(old.peer_id) == "py-libp2p/0.8.1", runs  # 0.1.0 never set its own
    text = sapo_node("status", "--url", pages[a], timeout=60)
    assert text.returncode == 0, text.stderr
    assert f"sapo/{sapo_version()}" in text.stdout and "py-libp2p/0.8.1" in text.stdout


# What the previous release's own decoder, and its peer score, make of each way the log-probs
# could travel (protocol/README.md, "Compatibility", records the outcome): run with its Python.
JUDGE_FRAMES = """
import json, sys
from pathlib import Path
from sapo.protocol.codec import DecodeLimits, decode
from sapo.protocol.messages import Rejected
from sapo.protocol.peer_guard import PENALTIES
out = {}
for path in sorted(Path(sys.argv[1]).glob("*.bin")):
    try:
        decode(path.read_bytes(), DecodeLimits())
        out[path.stem] = ["accepted", 0.0]
    except Rejected as refused:
        out[path.stem] = [refused.reason.value, PENALTIES.get(refused.reason.value, 0.0)]
print(json.dumps(out))
"""


def test_what_the_previous_release_makes_of_each_way_to_send_logprobs(tmp_path):
    import json
    import subprocess

    import msgpack

    from tests.protocol.golden.generate import BEHAVIOR, GROUP

    golden = Path(__file__).parent.parent / "protocol" / "golden"
    raw = lambda obj: b"\x00" + msgpack.packb(obj, use_bin_type=True)  # noqa: E731
    shared = msgpack.unpackb((golden / "0.3.0" / "shared_logprobs_v1.bin").read_bytes()[1:], raw=False)
    frames = {
        "group": (golden / "0.1.0" / "rollout_group_v1.bin").read_bytes(),
        "group_with_behavior_field": (golden / "0.2.0" / "rollout_group_v1_behavior.bin").read_bytes(),
        "group_with_any_new_field": raw({**GROUP, "later": 1}),
        "group_as_schema_v2": raw({**GROUP, "schema_version": 2, "behavior": BEHAVIOR}),
        "shared_logprobs_on_the_group_topic": (golden / "0.3.0" / "shared_logprobs_v1.bin").read_bytes(),
        "shared_logprobs_as_schema_v2": raw({**shared, "schema_version": 2}),
    }
    for name, frame in frames.items():
        (tmp_path / f"{name}.bin").write_bytes(frame)
    run = subprocess.run(
        [str(release_python(PREVIOUS)), "-c", JUDGE_FRAMES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout) == {
        "group": ["accepted", 0.0],  # what this release publishes as a group, log-probs shared or not
        "group_with_behavior_field": ["bad_schema", 10.0],  # 0.2.0's way: ten of them are a ban
        "group_with_any_new_field": ["bad_schema", 10.0],  # so no new field may ride in a group yet
        "group_as_schema_v2": ["unknown_schema_version", 0.0],  # free, but the group is lost to it
        "shared_logprobs_on_the_group_topic": ["bad_schema", 10.0],  # hence their own topic, which it never reads
        "shared_logprobs_as_schema_v2": ["unknown_schema_version", 0.0],  # free, but bytes it never wanted
    }
