"""A private swarm (--swarm-key), a peer allowlist (--allow-peers), no path escapes the data
dir, and an identity key others can read is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair

from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of
from sapo.protocol.settings import load_swarm_key
from tests.support.peer import Peer
from tests.support.processes import PLUMBING, TINY, TOPIC_PATH, NodeProcess, sapo_node

PSK = "6f" * 32
SWARM_KEY = f"/key/swarm/psk/1.0.0/\n/base16/\n{PSK}\n"


async def run_peers(node: NodeProcess, peers: list[Peer], seconds: float, until=None) -> None:
    """Publish from every peer twice a second, and ask for the node's groups, for `seconds` (or
    until `until()` holds)."""
    with trio.fail_after(seconds + 30):
        async with trio.open_nursery() as nursery:
            for peer in peers:
                await peer.start(nursery)
            end = trio.current_time() + seconds
            while trio.current_time() < end and not (until and until()):
                for peer in peers:
                    await peer.publish_honest()
                    peer.service.want(4)  # and, as a 0.4.0 node does each round, ask for groups
                await trio.sleep(0.5)
                assert node.alive(), node.log_text()[-3000:]
            nursery.cancel_scope.cancel()


def accepted_from(node: NodeProcess) -> dict[str, int]:
    rows = node.metrics()
    return rows[-1]["accepted_from"] if rows else {}


def test_swarm_key_file_format():
    assert load_swarm_key_text(SWARM_KEY) == PSK
    with pytest.raises(ValueError, match="swarm.key"):
        load_swarm_key_text(f"/key/swarm/psk/1.0.0/\n/base64/\n{PSK}\n")
    with pytest.raises(ValueError, match="64 hex"):
        load_swarm_key_text("/key/swarm/psk/1.0.0/\n/base16/\nabcd\n")


def load_swarm_key_text(text: str) -> str:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".key") as f:
        f.write(text)
        f.flush()
        return load_swarm_key(Path(f.name))


async def test_outsider_without_the_swarm_key_can_neither_receive_nor_inject(tmp_path, nodes):
    key_file = tmp_path / "swarm.key"
    key_file.write_text(SWARM_KEY)
    node = NodeProcess(tmp_path / "n", [*PLUMBING, *TOPIC_PATH, "--swarm-key", str(key_file)])
    nodes.append(node)
    member = Peer(1, node.address, swarm_key=key_file)
    outsider = Peer(2, node.address, swarm_key=None)
    await run_peers(
        node,
        [member, outsider],
        25,
        until=lambda: accepted_from(node).get(member.peer_id, 0) >= 3 and member.received() > 0,
    )
    await trio.sleep(1)
    assert accepted_from(node).get(member.peer_id, 0) >= 3, "the member with the key should get in"
    assert member.received() > 0, "the member with the key should receive the node's groups"
    assert outsider.peer_id not in accepted_from(node)
    assert outsider.received() == 0
    assert outsider.peer_id not in {p for r in node.metrics() for p in r["peers"]}


async def test_peer_not_on_the_allowlist_can_neither_receive_nor_inject(tmp_path, nodes):
    member = create_new_key_pair(bytes([3]) * 32)
    node = NodeProcess(tmp_path / "n", [*PLUMBING, *TOPIC_PATH, "--allow-peers", peer_id_of(member)])
    nodes.append(node)
    member_peer = Peer(3, node.address)
    outsider = Peer(4, node.address)
    await run_peers(
        node,
        [member_peer, outsider],
        25,
        until=lambda: accepted_from(node).get(member_peer.peer_id, 0) >= 3 and member_peer.received() > 0,
    )
    await trio.sleep(1)
    rows = node.metrics()
    assert accepted_from(node).get(member_peer.peer_id, 0) >= 3
    assert member_peer.received() > 0
    assert outsider.peer_id not in accepted_from(node)
    assert outsider.received() == 0
    assert rows[-1]["transport"].get("not_allowed", 0) > 0
    assert rows[-1]["rejected"].get("not_allowed", 0) > 0


async def test_model_id_with_dot_dot_in_a_message_creates_no_file(tmp_path, nodes):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    data = work / "data"
    node = NodeProcess(data, [*PLUMBING, *TOPIC_PATH])
    nodes.append(node)
    before = {p for p in tmp_path.rglob("*") if not p.is_relative_to(data)}
    peer = Peer(5, node.address, model_id="../../pwned")
    await run_peers(node, [peer], 25, until=lambda: accepted_from(node).get(peer.peer_id, 0) >= 3)
    node.stop()  # let it write its final checkpoint too
    assert accepted_from(node).get(peer.peer_id, 0) >= 3, "the groups themselves are honest and accepted"
    after = {p for p in tmp_path.rglob("*") if not p.is_relative_to(data)}
    assert after == before
    assert not any("pwned" in p.name for p in tmp_path.rglob("*"))
    assert not any("pwned" in p.name for p in Path.cwd().parent.glob("*"))
    assert {p.name for p in data.iterdir()} <= {"identity.key", "checkpoints", "metrics.jsonl", "models", "status.json"}


def test_model_path_outside_the_data_dir_is_read_only(tmp_path):
    """--model ../../x is a local path only if it is an existing directory, and is never written."""
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "passwd").write_text("root:x:0:0")
    snapshot = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    # a directory that holds no model fails when it loads (1); a missing path or a file is refused
    # with the settings, before anything loads (2)
    for model, code in [("../../etc", 1), ("../../missing", 2), ("../../etc/passwd", 2)]:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "sapo.node.cli",
                "start",
                *TINY,
                "--model",
                model,
                "--warm-start-steps",
                "2",
                "--listen",
                "/ip4/127.0.0.1/tcp/0",
                "--rounds",
                "1",
                "--data-dir",
                "data",
            ],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == code, result.stderr[-3000:]
        said = "sapo-node: error:" if code == 1 else "sapo-node: invalid settings:"
        assert "Traceback" not in result.stderr and said in result.stderr, result.stderr[-3000:]
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == snapshot
    assert not (tmp_path / "missing").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "etc"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b"]


def test_world_readable_identity_key_is_refused(tmp_path):
    data = tmp_path / "n"
    load_or_create_identity(data)
    (data / "identity.key").chmod(0o644)
    result = sapo_node(
        "start", *TINY, "--listen", "/ip4/127.0.0.1/tcp/0", "--rounds", "1", "--data-dir", str(data), timeout=60
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "chmod 600" in result.stderr and "identity.key" in result.stderr
    assert not (data / "metrics.jsonl").exists()
