"""A node's memory of its peers survives kill -9 (issues #40, #42): real node processes trade
groups over libp2p; the one killed mid-run restarts from its last checkpoint with the inbox, the
authors' standing, the intake's memories and the counters that checkpoint saved, and weighs its
peers from its first round as it did before."""

import itertools
import json
import signal
import time
from collections import Counter
from pathlib import Path

import trio

from sapo.training.learning.checkpoints import latest_checkpoint
from tests.support.peer import Peer
from tests.support.processes import PLUMBING, NodeProcess, free_port, wait_for, with_peers

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


# A short ramp, so that a peer is established within the test; fresh keys weigh little beside it;
# no screen, so that nothing but standing decides what the draw takes.
# A fixed balance, so that every round plans J = 2 (an adaptive one probes J = 3 every other
# round, more than the 2 honest groups the test waits for).
STANDING = ["--standing-ramp-seconds", "20", "--newcomer-share", "0.001", "--screen", "off", "--balance", "fixed"]


def standing_records(memory: dict) -> dict[str, list]:
    """author -> [since, last, groups, dropped, place], from a saved memory (sampling/standing.py)."""
    standing = memory["inbox"]["standing"]
    return {row[0]: row[1:] for row in [*standing["newcomers"], *standing["established"]]}


def running_memory(checkpoints: Path, after_round: int = 0) -> dict | None:
    """The newest checkpoint's memory past `after_round`, read while the node runs (never with
    `latest_checkpoint`, which clears checkpoints being written)."""
    written = sorted(checkpoints.glob("round-*"))
    if not written or int(written[-1].name.removeprefix("round-")) <= after_round:
        return None
    try:
        return json.loads((written[-1] / "memory.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # pruned, or not yet whole: look again
        return None


async def keep_sharing(peer: Peer) -> None:
    # twice a second, so that J = 2 of its groups are often waiting in the inbox when a round draws
    for round_index in itertools.count(1):
        await peer.share_honest(round_index)
        await trio.sleep(0.5)


async def test_after_kill_9_every_author_keeps_its_standing_and_the_established_peer_comes_first(tmp_path, nodes):
    """Must show 4 (issue #42): an honest peer whose groups carry signal earns full standing; a
    quiet one (an untrained tiny node: its groups carry none, kept only because the node adds
    completions of its own) earns none, a fresh key's standing. The node is killed with kill -9
    and restarted: every author's record is as the last checkpoint saved it, the inbox is back,
    and the first round after the restart draws the established peer's groups, not the quiet
    one's, though both wait in the inbox."""
    # It takes no one's groups (J = 0): fetching the honest peer's, it learnt the answer tags
    # within a minute or two, and its groups then carried signal and earned it standing.
    quiet = NodeProcess(tmp_path / "quiet", with_peers([*EXTRA, "--external", "0"], []))
    nodes.append(quiet)
    listen = f"/ip4/127.0.0.1/tcp/{free_port()}"  # the same after the restart: the peer dials it again
    args = with_peers([*EXTRA, *STANDING], [quiet.address])
    node = NodeProcess(tmp_path / "node", args, listen=listen)
    nodes.append(node)
    checkpoints = tmp_path / "node" / "checkpoints"
    honest = Peer(0x42, node.address)

    def ready() -> dict | None:
        memory = running_memory(checkpoints)
        if memory is None:
            return None
        records = standing_records(memory)
        held = Counter(entry[1]["origin"] for entry in memory["inbox"]["entries"])
        established = honest.peer_id in records and records[honest.peer_id][0] < time.time() - 30
        # J = 2 of the honest peer's groups waiting, so that the first round after the restart can
        # take J from it alone; read from the newest checkpoint, which the kill at once leaves
        return memory if established and held[honest.peer_id] >= 2 and held[quiet.peer_id] else None

    with trio.fail_after(400):
        async with trio.open_nursery() as nursery:
            await honest.join(nursery, node)
            nursery.start_soon(keep_sharing, honest)
            while ready() is None:
                assert node.alive(), node.log_text()[-3000:]
                await trio.sleep(1)
            node.stop(signal.SIGKILL)
            killed_at = time.time()
            checkpoint = latest_checkpoint(checkpoints)
            saved = checkpoint.memory()
            before = standing_records(saved)
            waiting = Counter(entry[1]["origin"] for entry in saved["inbox"]["entries"])
            # what the first round's draw can take: J = 2 of the honest peer's, and the quiet one's
            assert waiting[honest.peer_id] >= 2 and waiting[quiet.peer_id], waiting
            assert quiet.peer_id not in before  # no signal, no standing: a fresh key's weight
            restarted = await trio.to_thread.run_sync(lambda: NodeProcess(tmp_path / "node", args, listen=listen))
            nodes[1] = restarted
            while "memory of peers restored" not in restarted.log_text():
                await trio.sleep(0.5)
            line = next(line for line in restarted.log_text().splitlines() if "memory of peers restored" in line)
            assert f"{len(saved['inbox']['entries'])} groups waiting" in line, line
            assert f"{len(before)} authors' standing" in line, line
            while not (first := [r for r in restarted.metrics() if r["time"] > killed_at]):
                assert restarted.alive(), restarted.log_text()[-3000:]
                await trio.sleep(0.5)
            while (after := running_memory(checkpoints, first[0]["round"] - 1)) is None:
                await trio.sleep(0.5)
            nursery.cancel_scope.cancel()

    assert first[0]["round"] == checkpoint.round + 1
    # drawn by standing: the established peer's groups (1.0) over the quiet one's (0.001)
    chosen = first[0]["external_from"]
    assert list(chosen) == [honest.peer_id] and chosen[honest.peer_id] == first[0]["external_planned"] > 0, chosen
    records = standing_records(after)
    for author, (since, last, groups, dropped, place) in before.items():
        # its clock, what the screen found, its place: as saved; a round's credits move `last` only
        assert records[author][0] == since and records[author][3:] == [dropped, place], author
        assert records[author][1] >= last and records[author][2] >= groups
