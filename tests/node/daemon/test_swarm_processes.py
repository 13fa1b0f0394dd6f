"""Three real node processes, started through the CLI, gossiping over libp2p on 127.0.0.1."""

import signal
import time

from tests.support.processes import NodeProcess, start_node, wait_for


def used_external_from_both_others(node: NodeProcess, others: list[NodeProcess]) -> bool:
    rows = node.metrics()
    if not rows or not any(r["external_groups"] > 0 for r in rows):
        return False
    accepted = rows[-1]["accepted_from"]
    return all(accepted.get(o.peer_id, 0) > 0 for o in others)


def test_three_processes_share_groups_and_a_restarted_node_rejoins(tmp_path, nodes):
    # The untrained tiny model scores 0, so its groups carry no signal: receivers keep them only
    # because they augment (tests/support/processes.py PLUMBING); the uniform sampler lets this test
    # watch the plumbing, not the learning.
    from tests.support.processes import PLUMBING

    extra = list(PLUMBING)
    first = start_node(tmp_path / "n0", [], extra)
    nodes.append(first)
    nodes.append(start_node(tmp_path / "n1", [first.address], extra))
    nodes.append(start_node(tmp_path / "n2", [first.address], extra))
    for node in nodes:
        others = [o for o in nodes if o is not node]
        wait_for(
            lambda: used_external_from_both_others(node, others),
            timeout=180,
            what=f"{node.data_dir.name} to train on both peers' groups",
        )

    # kill -9 one node, restart it with the same data dir: same peer id, it rejoins and receives again
    victim = nodes[2]
    old_id = victim.peer_id
    victim.stop(signal.SIGKILL)
    last_round = max(r["round"] for r in victim.metrics())
    restarted = start_node(victim.data_dir, [first.address], extra)
    nodes[2] = restarted
    assert restarted.peer_id == old_id
    received_before = restarted.metrics()[-1]["round"] if restarted.metrics() else 0

    def receives_again():
        rows = [r for r in restarted.metrics() if r["round"] > received_before]
        return any(r["external_groups"] > 0 for r in rows) and rows[-1]["accepted"] > 0 if rows else False

    wait_for(receives_again, timeout=180, what="the restarted node to receive again")
    assert last_round >= 1
    # the others see it again too
    time_mark = time.time()
    wait_for(
        lambda: any(r["time"] > time_mark and old_id in r["peers"] for r in nodes[0].metrics()),
        timeout=60,
        what="the bootstrap node to list the restarted peer",
    )


def test_heterogeneous_tokenizers_train_on_each_others_text(tmp_path, nodes):
    """A char-level and a byte-level-BPE model share one topic; each re-encodes and trains on
    the other's completions (a quick warm start gives them rewards with some signal)."""
    common = [
        "--local",
        "2",
        "--external",
        "2",
        "--rounds",
        "0",
        "--warm-start-steps",
        "150",
        "--models-dir",
        str(tmp_path / "models"),
        "--task-config",
        '{"basic_arithmetic": {"operators": ["+"]}}',
    ]
    char = start_node(tmp_path / "char", [], [*common, "--model", "tiny"])
    nodes.append(char)
    bpe = start_node(tmp_path / "bpe", [char.address], [*common, "--model", "tiny-bpe"])
    nodes.append(bpe)

    def trained_on_peer(node, peer):
        rows = node.metrics()
        used = [r for r in rows if r["external_groups"] > 0 and r["loss"] is not None]
        return used and rows[-1]["accepted_from"].get(peer.peer_id, 0) > 0

    wait_for(lambda: trained_on_peer(char, bpe), timeout=240, what="the char model to train on BPE text")
    wait_for(lambda: trained_on_peer(bpe, char), timeout=240, what="the BPE model to train on char text")
