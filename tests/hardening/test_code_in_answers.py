"""Issue #38, as it was found: a running default node, a fresh identity that connects to it over
real libp2p, and one valid binary_matrix group (the right spec, question and key) whose answers are
Python. 0.3.0's node ran the command 17 s later (reasoning-gym's scorer `eval`s any answer that is
not the key). Here the stranger serves the group when the node asks for groups (a default node
fetches; a group pushed on the topic is refused before any check), the group is verified, every
code answer scores 0, the file never appears, and the node keeps serving: an honest group served
after it is accepted."""

from __future__ import annotations

import trio

from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import EASY_CONFIGS, ProblemSpec, generate_problem
from tests.support.hostile_answers import code_execution_answers
from tests.support.peer import Peer
from tests.support.processes import PLUMBING, NodeProcess


async def test_a_group_of_code_answers_runs_nothing_on_a_running_node(tmp_path, nodes):
    marker = tmp_path / "MARKER"
    node = NodeProcess(tmp_path / "n", [*PLUMBING])
    nodes.append(node)
    stranger = Peer(0x38, node.address, model_id="stranger", exchange="fetch")
    problem = generate_problem(
        ProblemSpec(dataset="binary_matrix", config=EASY_CONFIGS["binary_matrix"], seed=38, index=0)
    )
    answers = code_execution_answers(str(marker))
    texts = [f"<answer>{answer}</answer>" for answer in answers[:40]] + [f"<answer>{problem.answer}</answer>"]
    frame = stranger.encoder.frame(QuestionGroup(problem=problem, completions=texts, rewards=[1.0] * len(texts)), 1)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await stranger.join(nursery, node)
            assert await stranger.service.share(frame, 1)  # the node asks its peers each round
            while not (node.metrics() or [{}])[-1].get("received"):
                await trio.sleep(1)
            await trio.sleep(20)  # 0.3.0 ran the command after 17 s
            await stranger.share_honest(2)
            while (node.metrics() or [{}])[-1].get("accepted_from", {}).get(stranger.peer_id, 0) < 2:
                assert node.alive(), node.log_text()[-3000:]
                await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
    last = node.metrics()[-1]
    assert not marker.exists()
    assert "while scoring a stranger's text" not in node.log_text()  # the grammars left the guard nothing to refuse
    assert last["accepted_from"][stranger.peer_id] == 2, last[
        "rejected"
    ]  # the code group (its one right answer) and the honest one
    assert last["rejected"].get("internal_error", 0) == 0
