"""A node's memory of its peers in its checkpoint (node/core/memory.py): written in pieces, so
that saving a full inbox never holds the GIL in one long call, and a memory the node cannot read
is left behind with a warning rather than keeping the node from starting."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest
import trio

from sapo.node.core.memory import MEMORY_VERSION, NodeMemory
from sapo.node.core.memory_exchange import MemoryHub
from sapo.node.core.round import run_round
from sapo.training.learning.checkpoints import Checkpoint, write_json_in_pieces
from sapo.training.problems.tasks import reasoning_gym_version
from tests.support.tiny_nodes import PEER, member, tiny_node


async def _node_with_memory(tmp_path):
    node, peer = tiny_node(tmp_path / "a"), tiny_node(tmp_path / "peer", PEER, local=6, external=0)
    hub = MemoryHub(time.time, rg_version=reasoning_gym_version())
    mine, theirs = member(hub, node), member(hub, peer, receives=False)
    state, peer_state = node.start_state(), peer.start_state()
    for _ in range(2):
        peer_state = (await run_round(peer, peer_state, theirs, trio.Lock())).state
        state = (await run_round(node, state, mine, trio.Lock())).state
    return node, state


async def test_the_memory_is_written_in_pieces_and_reads_back_whole(tmp_path):
    node, state = await _node_with_memory(tmp_path)
    memory = node.memory.to_json()
    assert memory["inbox"]["entries"] and memory["intake"]["frames"]
    out = io.StringIO()
    write_json_in_pieces(memory, out)
    assert json.loads(out.getvalue()) == json.loads(json.dumps(memory))
    saved = node.checkpoint(state).memory()
    assert saved == json.loads(json.dumps(memory))


async def test_a_memory_it_cannot_read_is_left_behind_and_the_node_starts(tmp_path, monkeypatch, caplog):
    node, state = await _node_with_memory(tmp_path)
    node.checkpoint(state)
    monkeypatch.setattr(Checkpoint, "memory", lambda self: {"version": 999})  # another release's
    with caplog.at_level(logging.WARNING, logger="sapo.node"):
        restarted = tiny_node(tmp_path / "a")
    assert "could not restore the memory of peers" in caplog.text
    assert restarted.start_state() == state  # its rounds go on: only the memory is new
    assert isinstance(restarted.memory, NodeMemory) and len(restarted.inbox) == 0
    assert restarted.memory.inbox is restarted.inbox and restarted.counters.accepted == 0


async def test_a_memory_saved_by_0_4_still_loads_with_its_authors_standing(tmp_path, monkeypatch):
    """Memory version 1 (0.4.x) held standing as [author, seconds earned, last credited, place]:
    a node that finds one (left alone for a while, then upgraded) starts with it, an author that
    had full standing keeps it, and one silent for over a week starts again."""
    node, state = await _node_with_memory(tmp_path)
    node.checkpoint(state)
    now = time.time()
    month_ago = now - 30 * 86400
    saved = json.loads(json.dumps(node.memory.to_json())) | {"version": 1}
    saved["inbox"]["standing"] = [
        ["12D3KooWgone", 600.0, month_ago, None],
        [PEER, 600.0, now - 60, "203.0.0.0/16"],
        ["12D3KooWhalf", 300.0, now - 60, None],
    ]
    monkeypatch.setattr(Checkpoint, "memory", lambda self: saved)
    restarted = tiny_node(tmp_path / "a")
    assert restarted.memory_restored and len(restarted.inbox) == len(node.inbox)
    standing = restarted.inbox.standing
    assert standing.of(PEER, now) == 1.0 and standing.of("12D3KooWhalf", now) == pytest.approx(0.5 + 60 / 600)
    assert standing.of("12D3KooWgone", now) == 0.0 and len(standing) == 3
    assert restarted.memory.to_json()["version"] == MEMORY_VERSION == 2  # written anew in this release's form
