"""A node's memory of its peers survives kill -9 (issue #40): two real node processes gossip
over libp2p; the one killed mid-run restarts from its last checkpoint with the inbox, the
authors' standing, the intake's memories and the counters that checkpoint saved."""

import json
import signal
import time

from sapo.training.learning.checkpoints import latest_checkpoint
from tests.support.processes import PLUMBING, NodeProcess, wait_for, with_peers

EXTRA = [*PLUMBING, "--checkpoint-every", "1", "--inbox-max-age-seconds", "86400"]


def accepted_from(node: NodeProcess, peer: str) -> int:
    rows = node.metrics()
    return rows[-1]["accepted_from"].get(peer, 0) if rows else 0


def test_a_node_killed_mid_run_restores_its_memory_of_its_peers(tmp_path, nodes):
    peer = NodeProcess(tmp_path / "peer", with_peers(EXTRA, []))
    nodes.append(peer)
    node = NodeProcess(tmp_path / "node", with_peers(EXTRA, [peer.address]))
    nodes.append(node)
    checkpoints = tmp_path / "node" / "checkpoints"

    def saved_memory() -> dict | None:
        # read, never `latest_checkpoint`, while the node runs: that clears checkpoints being written
        written = sorted(checkpoints.glob("round-*"))
        try:
            memory = json.loads((written[-1] / "memory.json").read_text()) if written else None
        except FileNotFoundError:  # pruned as a newer one landed: look again
            return None
        # one that remembers the peer's groups: verified frames, and counts of what it accepted
        return memory if memory and memory["counters"]["accepted"] >= 4 and memory["intake"]["frames"] else None

    wait_for(saved_memory, timeout=240, what="a checkpoint that remembers the peer's groups")
    node.stop(signal.SIGKILL)  # no clean shutdown: what the last checkpoint holds is what there is
    killed_at = time.time()
    checkpoint = latest_checkpoint(checkpoints)
    memory = checkpoint.memory()
    saved = memory["counters"]
    frames = sum(len(entries) for _, entries in memory["intake"]["frames"])
    groups = len(memory["inbox"]["entries"])
    assert saved["accepted_from"] and frames >= saved["accepted"]

    restarted = NodeProcess(tmp_path / "node", with_peers(EXTRA, [peer.address]))
    nodes[1] = restarted
    assert restarted.peer_id == node.peer_id
    wait_for(lambda: "memory of peers restored" in restarted.log_text(), timeout=120, what="the memory to load")
    line = next(line for line in restarted.log_text().splitlines() if "memory of peers restored" in line)
    assert f"{groups} groups waiting" in line and f"{frames} verified frames remembered" in line, line

    def first_round_after_restart() -> dict | None:
        rows = [r for r in restarted.metrics() if r["time"] > killed_at]
        return rows[0] if rows else None

    first = wait_for(first_round_after_restart, timeout=180, what="a round after the restart")
    assert first["round"] == checkpoint.round + 1
    # the counts go on from what was saved, not from zero
    assert first["accepted"] >= saved["accepted"] and first["received"] >= saved["received"]
