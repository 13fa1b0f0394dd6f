"""An inbox as a study's run checkpoint saves it: the same groups, in the same order, with the same
authors' standing, so that a resumed run chooses and evicts as the run that never stopped."""

from __future__ import annotations

import json

from sapo.sampling.inbox import Inbox
from sapo.sampling.standing import Standing
from tests.support.groups import honest_group


def inbox() -> Inbox:
    return Inbox(4, 2**20, 600, peer_share=0.5, standing=Standing(600, 0.1))


def test_a_restored_inbox_holds_chooses_and_evicts_as_the_saved_one():
    saved = inbox()
    for i, author in enumerate(["a", "b", "a", "c", "a"]):
        saved.standing.credit(author, 1000.0 + 30 * i)  # as the node's memory credits what it keeps
        saved.add(honest_group(i).model_copy(update={"origin": author}), 1000.0 + 30 * i)
    saved.standing.screened("b", 1.0)
    restored = inbox()
    restored.restore(json.loads(json.dumps(saved.to_json())))
    assert restored.to_json() == saved.to_json()
    assert restored.newest_first(1200.0) == saved.newest_first(1200.0)
    assert restored.size_bytes == saved.size_bytes and restored.peers() == saved.peers()
    for box in (saved, restored):
        box.add(honest_group(9).model_copy(update={"origin": "d"}), 1300.0)
    assert restored.to_json() == saved.to_json()
