"""Issue #29: a node that regenerates answers from what the judge sends scores no higher than its
real accuracy.

Judge wire v1 sent each question's spec (dataset, config, seed, index), from which ReasoningGYM
rebuilds the problem and its answer key exactly; and the judge drew its specs from a public default
seed and a counter, so even the question text alone named the next problems. The cheat below
takes everything the judge sends, tries every way it knows to rebuild the problem, and answers
with the regenerated key when the question text matches. Against the real judge (in-process, over
real libp2p on loopback, with the scripted wire client of test_judge_service.py and with the node's
own JudgeClient) it earns exactly what its honest answers earn; against v1's message it earns 1.0.

The judge asks arc_1d, whose question space is large (none of 200 random questions matched the 256
a scan tries), and basic_arithmetic, whose 200 or so questions a node can simply solve: the
cheat's honest side is a real arithmetic solver and a fixed wrong answer for arc_1d.
"""

from __future__ import annotations

import re
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import trio

from sapo.node.judge import client as judge_client
from sapo.node.judge.server import DB_FILE_NAME, load_results
from sapo.protocol.toolkit.frames import read_frame
from sapo.protocol.wire import judge_wire as wire
from sapo.training.problems.rewards import score_completion
from sapo.training.problems.tasks import EASY_CONFIGS, ProblemSpec, generate_problem
from tests.support.judge import client, start_judge
from tests.support.releases import ROOT, released

OLD_DEFAULT_SEED = 1_000_003  # the judge's `--seed` default before #29; its index counted results
SCAN = 256  # how far past the old default seed the cheat looks for a matching question
WRONG = "<answer>not a number</answer>"
QUESTIONS = 12
TASKS = ["arc_1d", "basic_arithmetic"]


@pytest.fixture
async def judge(tmp_path, nursery):
    service = await start_judge(nursery, tmp_path, TASKS)
    yield service
    service.store.close()


def maps_and_ints(value: Any) -> Iterator[Any]:
    """Every map and every int anywhere in a decoded frame (hex ids count as ints too)."""
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from maps_and_ints(item)
    elif isinstance(value, list):
        for item in value:
            yield from maps_and_ints(item)
    elif isinstance(value, int) and not isinstance(value, bool):
        yield value
    elif isinstance(value, str) and re.fullmatch(r"[0-9a-f]{1,64}", value):
        yield int(value, 16)


def candidate_specs(sent: dict[str, Any], task: str) -> Iterator[ProblemSpec]:
    """Every spec a cheat could read off, or guess from, what the judge sent."""
    config = EASY_CONFIGS.get(task, {})
    for found in maps_and_ints(sent):
        if isinstance(found, dict):
            for fields in (found, {"dataset": task, "config": config, **found}):
                try:
                    yield ProblemSpec.model_validate(fields)
                except Exception:  # noqa: BLE001 - not a spec
                    pass
        elif 0 <= found < 2**63:  # a number sent: perhaps a seed, perhaps an index
            yield ProblemSpec(dataset=task, config=config, seed=found, index=0)
            if found < 2**31:
                yield ProblemSpec(dataset=task, config=config, seed=OLD_DEFAULT_SEED, index=found)
    for index in range(SCAN):  # ReasoningGYM seeds item i with seed + i: the old judge's scheme
        yield ProblemSpec(dataset=task, config=config, seed=OLD_DEFAULT_SEED, index=index)


def regenerated_answer(sent: dict[str, Any]) -> str | None:
    """The answer key, if anything sent rebuilds a problem with exactly this question text."""
    task, text = sent.get("task", ""), sent.get("question")
    for spec in candidate_specs(sent, task):
        try:
            problem = generate_problem(spec)
        except Exception:  # noqa: BLE001 - a guess the generator refuses
            continue
        if problem.question == text:
            return problem.answer
    return None


def honest_answer(question: str) -> str:
    """A real solver for the easy arithmetic; a fixed wrong answer for anything else."""
    match = re.fullmatch(r"Calculate (-?\d+) ([+-]) (-?\d+)\.", question)
    if not match:
        return WRONG
    a, b = int(match[1]), int(match[3])
    return f"<answer>{a + b if match[2] == '+' else a - b}</answer>"


async def read_raw(stream) -> dict[str, Any]:
    """The judge's next frame exactly as sent: every key, known to this release or not."""
    return msgpack.unpackb(await read_frame(stream, wire.MAX_FRAME_BYTES), raw=False)


def the_old_judges_question(index: int) -> dict[str, Any]:
    """What a v1 judge sent: its spec came from the default seed and a results counter."""
    spec = ProblemSpec(dataset="arc_1d", config=EASY_CONFIGS["arc_1d"], seed=OLD_DEFAULT_SEED, index=index)
    problem = generate_problem(spec)
    return {
        "schema_version": 1,
        "kind": "question",
        "id": "0123456789abcdef",
        "task": spec.dataset,
        "question": problem.question,
        "spec": spec.model_dump(),
    }


def test_the_same_cheat_scores_one_against_judge_wire_v1():
    for index in (0, 7, 100):
        sent = the_old_judges_question(index)
        problem = generate_problem(ProblemSpec.model_validate(sent["spec"]))
        assert score_completion(problem, f"<answer>{regenerated_answer(sent)}</answer>") == 1.0
        # and without the spec, v1's predictable seeds gave it away all the same
        blind = {k: v for k, v in sent.items() if k != "spec"}
        assert score_completion(problem, f"<answer>{regenerated_answer(blind)}</answer>") == 1.0


async def test_a_cheat_that_reads_every_byte_scores_what_its_honest_answers_earn(judge, nursery, tmp_path):
    node = await client(nursery, judge)
    judged, rebuilt = [], 0
    for node_round in range(QUESTIONS):
        stream = await node.open()
        with trio.fail_after(10):
            await wire.write_message(stream, node.request(node_round=node_round))
            sent = await read_raw(stream)
        assert set(sent) == {"schema_version", "kind", "id", "task", "question"}, sent
        key = regenerated_answer(sent)
        rebuilt += key is not None and sent["task"] == "arc_1d"  # an arithmetic match is just the sum
        text = f"<answer>{key}</answer>" if key is not None else honest_answer(sent["question"])
        with trio.fail_after(10):
            await wire.write_message(stream, wire.Answer(id=sent["id"], text=text))
            judged.append((await wire.read_message(stream, wire.Score)).score)
    assert rebuilt == 0
    # what the honest answers earn, scored with the keys only the judge holds
    rows = load_results(tmp_path / DB_FILE_NAME)
    problems = [generate_problem(ProblemSpec.model_validate_json(row["spec"])) for row in rows]
    earned = [score_completion(problem, honest_answer(problem.question)) for problem in problems]
    assert judged == earned == [r["score"] for r in rows]
    assert sum(judged) == sum(r["task"] == "basic_arithmetic" for r in rows)  # its real accuracy, no more


def test_question_seeds_are_unpredictable_and_apart_from_the_nodes(tmp_path):
    from libp2p.crypto.ed25519 import create_new_key_pair

    from sapo.node.judge.server import JudgeService, JudgeSettings, ResultStore

    store = ResultStore(tmp_path / DB_FILE_NAME)
    service = JudgeService(JudgeSettings(data_dir=tmp_path, tasks=["basic_arithmetic"]), create_new_key_pair(), store)
    seeds = [service._next_spec().seed for _ in range(64)]
    store.close()
    assert len(set(seeds)) == 64
    # nodes seed their problems below 2**32 (+ an index below 2**31): a judge question is held out
    assert sum(seed < 2**33 for seed in seeds) == 0


async def test_a_cheating_node_client_scores_what_a_wrong_answer_earns(nursery, tmp_path, monkeypatch):
    """The node's own JudgeClient, with its model swapped for the cheat, on arc_1d only."""
    from libp2p.crypto.ed25519 import create_new_key_pair

    judge = await start_judge(nursery, tmp_path, ["arc_1d"])
    tried = []

    def cheat(policy, problem, max_new_tokens):  # what the client hands its model
        sent = {"task": problem.spec.dataset, "question": problem.question, "spec": problem.spec.model_dump()}
        key = regenerated_answer(sent)
        tried.append(key)
        return f"<answer>{key}</answer>" if key is not None else WRONG

    monkeypatch.setattr(judge_client, "answer_greedily", cheat)
    node = judge_client.JudgeClient(
        judge.listen_addrs[0],
        1,
        create_new_key_pair(),
        policy=types.SimpleNamespace(model_id="cheat"),
        torch_lock=trio.Lock(),
        max_new_tokens=8,
    )
    await nursery.start(node.run)
    scores = [await node.evaluate(node_round) for node_round in range(1, 7)]
    assert scores == [0.0] * 6 and tried == [None] * 6
    assert node.judged == 6 and node.score_sum == 0.0 and judge.counters["judged"] == 6
    judge.store.close()


# --- an old node meets the new judge ------------------------------------------------------------


def old_judge_wire() -> types.ModuleType:
    """Release 0.1.0's own protocol/wire/judge_wire.py (0.2.0's is the same), from this repository's history."""
    commit = released().get("0.1.0")
    source = subprocess.run(
        ["git", "show", f"{commit}:protocol/wire/judge_wire.py"], cwd=ROOT, capture_output=True, text=True
    )
    if not commit or source.returncode:
        pytest.skip(f"release 0.1.0's judge_wire.py is not in this clone's history: {source.stderr[:200]}")
    module = types.ModuleType("judge_wire_0_1_0")
    sys.modules[module.__name__] = module  # pydantic resolves the models' annotations through it
    try:
        exec(compile(source.stdout, "judge_wire_0_1_0.py", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


async def test_an_old_node_gets_a_refusal_it_reads_and_the_judge_keeps_serving(judge, nursery, tmp_path):
    old = old_judge_wire()
    node = await client(nursery, judge)
    stream = await node.open()
    with trio.fail_after(10):
        await stream.write(
            old.encode(old.EvalRequest(peer_id=node.peer_id, model_id="old", node_round=1, swarm_peers_seen=0))
        )
        # the old client reads a Question; it meets the judge's error frame, which it can read
        with pytest.raises(old.JudgeWireError) as refused:
            await old.read_message(stream, old.Question)
    assert refused.value.reason is old.WireErrorReason.unexpected_kind  # counted, logged, never a crash
    assert refused.value.detail.startswith("the judge refused: retired_schema_version: ")
    assert "upgrade the node to sapo 0.3.0" in refused.value.detail
    assert judge.counters["retired_schema_version"] == 1
    assert load_results(tmp_path / DB_FILE_NAME) == []
    # a v2 judge's question, had it sent one, would be refused by the old node as a version it does not read
    with pytest.raises(old.JudgeWireError) as unknown:
        old.decode(wire.encode(wire.Question(id="0123456789abcdef", task="bf", question="?")), old.Question)
    assert unknown.value.reason is old.WireErrorReason.unknown_schema_version
