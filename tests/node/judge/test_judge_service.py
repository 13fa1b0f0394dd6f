"""The judge service in-process on 127.0.0.1: real libp2p hosts, scripted clients (no model)."""

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair

from sapo.node.judge.server import DB_FILE_NAME, JudgeResult, ResultStore, load_results
from sapo.protocol.peers.identity import peer_id_of
from sapo.protocol.wire import judge_wire as wire
from sapo.training.problems.tasks import generate_problem
from tests.support.judge import ask, client, reply, start_judge


@pytest.fixture
async def judge(tmp_path, nursery):
    service = await start_judge(nursery, tmp_path, ["basic_arithmetic"])
    yield service
    service.store.close()


def correct(judge, question: wire.Question) -> str:
    """The right answer, from the spec the judge drew (never sent) for this question's text."""
    problems = [generate_problem(spec) for spec in judge.issued]
    return f"<answer>{next(p.answer for p in reversed(problems) if p.question == question.question)}</answer>"


async def test_a_correct_answer_scores_one_and_is_stored(judge, nursery, tmp_path):
    c = await client(nursery, judge)
    stream = await c.open()
    question = await ask(stream, c.request(node_round=11))
    assert question.task == "basic_arithmetic" and not hasattr(question, "spec")
    assert await reply(stream, question, "thinking... " + correct(judge, question)) == 1.0
    stream2 = await c.open()
    q2 = await ask(stream2, c.request(node_round=12))
    assert q2.id != question.id
    assert await reply(stream2, q2, "no tag at all") == 0.0
    rows = load_results(tmp_path / DB_FILE_NAME)
    assert [(r["peer_id"], r["node_round"], r["score"], r["question_id"]) for r in rows] == [
        (c.peer_id, 11, 1.0, question.id),
        (c.peer_id, 12, 0.0, q2.id),
    ]
    assert rows[0]["model_id"] == "scripted" and rows[0]["swarm_peers_seen"] == 1 and rows[0]["judged_at"] > 0


@pytest.mark.parametrize(
    "send, reason",
    [
        (b"\x00\x00\x00\x03\xc1\xc1\xc1", "bad_msgpack"),
        (b"\xff\xff\xff\xff", "oversized"),
        (wire.encode(wire.Answer(id="0123456789abcdef", text="hi")), "unexpected_kind"),
    ],
)
async def test_malformed_requests_get_an_error_frame_and_the_judge_keeps_serving(judge, nursery, send, reason):
    c = await client(nursery, judge)
    stream = await c.open()
    await stream.write(send)
    with trio.fail_after(10):
        with pytest.raises(wire.JudgeWireError, match=f"the judge refused: {reason}"):
            await wire.read_message(stream, wire.Question)
        with pytest.raises(wire.JudgeWireError, match="truncated"):  # and the stream is closed
            await wire.read_message(stream, wire.Question)
    assert judge.counters[reason] == 1
    stream = await c.open()
    question = await ask(stream, c.request())
    assert await reply(stream, question, correct(judge, question)) == 1.0


async def test_a_request_in_another_peers_name_is_refused(judge, nursery, tmp_path):
    c = await client(nursery, judge)
    stream = await c.open()
    other = peer_id_of(create_new_key_pair())
    with pytest.raises(wire.JudgeWireError, match="peer_mismatch"):
        await ask(stream, c.request(peer_id=other))
    assert judge.counters["peer_mismatch"] == 1
    assert load_results(tmp_path / DB_FILE_NAME) == []


async def test_an_answer_to_another_question_is_refused(judge, nursery):
    c = await client(nursery, judge)
    stream = await c.open()
    question = await ask(stream, c.request())
    await wire.write_message(stream, wire.Answer(id="f" * 16, text="<answer>1</answer>"))
    with trio.fail_after(10), pytest.raises(wire.JudgeWireError, match="wrong_question"):
        await wire.read_message(stream, wire.Score)
    assert question.id != "f" * 16


async def test_two_nodes_are_judged_concurrently(judge, nursery, tmp_path):
    a, b = await client(nursery, judge), await client(nursery, judge)
    stream_a, stream_b = await a.open(), await b.open()
    # Both hold a question before either answers: the judge serves them at the same time.
    question_a = await ask(stream_a, a.request(node_round=1))
    question_b = await ask(stream_b, b.request(node_round=2))
    scores = {}

    async def answer(name, stream, question, text):
        scores[name] = await reply(stream, question, text)

    async with trio.open_nursery() as inner:
        inner.start_soon(answer, "b", stream_b, question_b, correct(judge, question_b))
        inner.start_soon(answer, "a", stream_a, question_a, "<answer>wrong</answer>")
    assert scores == {"a": 0.0, "b": 1.0}
    rows = load_results(tmp_path / DB_FILE_NAME)
    assert sorted((r["peer_id"], r["score"]) for r in rows) == sorted([(a.peer_id, 0.0), (b.peer_id, 1.0)])


def test_results_survive_reopening_the_store(tmp_path):
    path = tmp_path / DB_FILE_NAME
    store = ResultStore(path)
    for i in range(3):
        store.add(JudgeResult(f"{i:016x}", "12D3KooWx", "tiny", i, 0, 0, "bf", "{}", "a", 0.5, 1.0 + i))
    store.close()
    assert ResultStore(path).count() == 3
    assert [r["node_round"] for r in load_results(path)] == [0, 1, 2]
