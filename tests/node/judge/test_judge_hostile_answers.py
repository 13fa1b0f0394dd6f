"""Issue #38: the judge scores a node's answer through the same verifier as the intake, so no
answer can make it run code. Over real libp2p on loopback: the binary_matrix answer that made a 0.4
node run a shell command, and 100 other code-execution strings, each sent as the answer to a real
judge question, every one of the nine tasks asked; each scores 0, and the judge's scoring threads
saw no file, process, socket, compile or import (a witness audit hook, independent of the guard)."""

from __future__ import annotations

from sapo.node.judge import server
from sapo.node.judge.server import DB_FILE_NAME, load_results
from sapo.training.problems import untrusted
from sapo.training.problems.tasks import PAPER_TASKS
from tests.support.hostile_answers import code_execution_answers, witness
from tests.support.judge import ask, client, reply, start_judge


async def test_no_answer_runs_code_in_the_judge(nursery, tmp_path, monkeypatch):
    marker = tmp_path / "MARKER"
    judge = await start_judge(nursery, tmp_path, list(PAPER_TASKS))
    seen = witness()
    scoring = server.score_completion

    def watched(problem, text):  # the judge's own scorer, on its worker thread, under the witness
        with seen.watching():
            return scoring(problem, text)

    monkeypatch.setattr(server, "score_completion", watched)
    refused = untrusted.refused_count
    node = await client(nursery, judge)
    scores = []
    for answer in code_execution_answers(str(marker)):
        stream = await node.open()
        question = await ask(stream, node.request())
        scores.append(await reply(stream, question, f"<answer>{answer}</answer>"))
    judge.store.close()
    rows = load_results(tmp_path / DB_FILE_NAME)
    assert len(rows) == 101 and scores == [0.0] * 101 == [row["score"] for row in rows]
    assert {row["task"] for row in rows} == set(PAPER_TASKS)  # every task was asked
    assert not marker.exists() and seen.events == [] and untrusted.refused_count == refused
