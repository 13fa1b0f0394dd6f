"""Issue #38: a peer's text is never code. A stranger's answer, through the real intake (a real
frame, decoded, regenerated and re-scored), cannot run code on the node: the binary_matrix answer
that made a 0.3.0 node run a shell command, and 100 other code-execution strings on each of the nine
tasks, leave no file, no process, no socket and no module loaded, and every group is refused or
scored 0. The guard under the grammars refuses what reasoning-gym's own scorer would have run."""

from __future__ import annotations

import ast
import hashlib
import inspect
import os
import textwrap
from pathlib import Path

import pytest
import reasoning_gym

from sapo.node.core.exchange import GroupEncoder
from sapo.node.study.nodes import peer_id_for
from sapo.training.problems import untrusted
from sapo.training.problems.rewards import accept_group, score_completion, score_group
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import (
    EASY_CONFIGS,
    PAPER_TASKS,
    ProblemSpec,
    dataset_for,
    generate_problem,
    reasoning_gym_version,
)
from tests.support.hostile_answers import code_execution_answers, witness
from tests.support.intake import intake

NOW = 1_700_000_000.0  # tests.node.core.test_intake's
ATTACKER = peer_id_for(0, 9)


def problem_for(task: str, index: int = 0):
    return generate_problem(ProblemSpec(dataset=task, config=EASY_CONFIGS[task], seed=38, index=index))


@pytest.mark.parametrize("verifier", [accept_group, score_group], ids=["binary", "partial"])
def test_no_code_execution_string_does_anything_through_the_real_intake(tmp_path, verifier):
    marker = tmp_path / "MARKER"
    answers = code_execution_answers(str(marker))
    node, _ = intake(verifier=verifier)
    encoder = GroupEncoder(
        peer_id=ATTACKER, swarm="t", model_id="m", rg_version=reasoning_gym_version(), clock=lambda: NOW
    )
    problems = {(task, index): problem_for(task, index) for task in PAPER_TASKS for index in range(2)}
    refused_before = untrusted.refused_count
    seen = witness()  # watches the scoring thread; the problems were generated (and cached) above
    outcomes = []
    with seen.watching():
        for task in PAPER_TASKS:
            for index, start in enumerate(range(0, len(answers), 51)):  # two groups, up to 64 completions each
                problem = problems[task, index]
                texts = [f"<answer>{answer}</answer>" for answer in answers[start : start + 51]]
                # the attacker's strongest case: one completion carries the real key, so the group has signal
                right = problem.answer if task != "propositional_logic" else problem.metadata["example_answer"]
                texts.append(f"<answer>{right}</answer>")
                group = QuestionGroup(problem=problem, completions=texts, rewards=[1.0] * len(texts))
                accepted = node.accept(encoder.frame(group, index + 1), ATTACKER, NOW)
                outcomes.append((task, accepted))
    assert not marker.exists()
    assert seen.events == []  # no exec, compile, import, open, process or socket on the scoring thread
    assert untrusted.refused_count == refused_before  # the grammars stopped it all: the guard had nothing to do
    for task, accepted in outcomes:
        if accepted is not None:  # accepted only for the real key: every code string scored 0
            assert accepted.rewards[:-1] == [0.0] * (len(accepted.rewards) - 1), task
    assert node.counters.rejected.get("internal_error", 0) == 0


def test_each_answer_scores_zero_on_every_task(tmp_path):
    marker = tmp_path / "MARKER"
    problems = [problem_for(task) for task in PAPER_TASKS]
    seen = witness()
    with seen.watching():
        for problem in problems:
            task = problem.spec.dataset
            for answer in code_execution_answers(str(marker)):
                assert score_completion(problem, f"<answer>{answer}</answer>") == 0.0, (task, answer)
    assert not marker.exists() and seen.events == []


def test_the_guard_refuses_what_reasoning_gyms_own_scorer_would_run(tmp_path):
    """Defence in depth: were a scorer ever to `eval` a stranger's text again, it fails closed."""
    marker = tmp_path / "MARKER"
    problem = problem_for("binary_matrix")
    entry = {"question": problem.question, "answer": problem.answer, "metadata": problem.metadata}
    before = untrusted.refused_count
    with untrusted.untrusted_text():
        score = dataset_for(problem.spec).score_answer(f"__import__('os').system('touch {marker}')", entry)
    assert score == 0.0 and not marker.exists()
    assert untrusted.refused_count == before + 1
    assert untrusted.recent_refusals[-1][0] == "compile"


@pytest.mark.parametrize(
    "attempt",
    [
        lambda m: os.system(f"touch {m}"),
        lambda m: open(m, "w"),  # noqa: SIM115 - it must not open at all
        lambda m: __import__("socket").create_connection(("127.0.0.1", 9), timeout=0.1),
        lambda m: __import__("subprocess").run(["touch", str(m)]),
        lambda m: exec(f"open({str(m)!r}, 'w')"),  # noqa: S102 - what a careless scorer does
        lambda m: __import__("xml.dom.minidom"),  # a module not loaded yet runs its code when imported
    ],
    ids=["os.system", "open", "socket", "subprocess", "exec", "import"],
)
def test_the_guard_refuses_code_processes_sockets_files_and_imports(tmp_path, attempt):
    marker = tmp_path / "MARKER"
    before = untrusted.refused_count
    with pytest.raises(untrusted.UntrustedCodeRefused), untrusted.untrusted_text():
        attempt(marker)
    assert not marker.exists() and untrusted.refused_count == before + 1
    marker.write_text("x")  # outside the block, the thread is free again
    assert marker.exists()


def test_the_guard_acts_on_its_own_thread_only_and_no_thread_starts_under_it(tmp_path):
    import threading

    marker = tmp_path / "MARKER"
    go, done = threading.Event(), threading.Event()

    def other_thread():
        go.wait(10)
        marker.write_text("x")  # another thread, started before the block: free
        done.set()

    threading.Thread(target=other_thread).start()
    before = untrusted.refused_count
    with untrusted.untrusted_text():
        go.set()
        done.wait(10)
        with pytest.raises(untrusted.UntrustedCodeRefused):
            threading.Thread(target=lambda: os.system(f"touch {tmp_path / 'ESCAPED'}")).start()
    assert marker.exists() and not (tmp_path / "ESCAPED").exists()
    assert untrusted.refused_count == before + 1
    assert untrusted.recent_refusals[-1][0] == "_thread.start_new_thread"


# --- reasoning-gym's scorers: which of them read their answer as code ---------------------------

# Pinned for reasoning-gym 0.1.25: the nine tasks' scorers that `eval`/`exec` the answer. The node
# calls none of the nine scorers (training/problems/task_scorers.py replaces them), and these pins make an
# upgrade that changes any of them fail here, so its new behaviour is read before it ships.
EVALUATES_ITS_ANSWER = {"binary_matrix"}
SCORER_DIGESTS = {
    "base_conversion": "6324bfc86976",
    "basic_arithmetic": "6324bfc86976",
    "arc_1d": "6324bfc86976",
    "bf": "6324bfc86976",
    "propositional_logic": "d5ee3d0d7fc2",
    "fraction_simplification": "2000b56e1716",
    "decimal_arithmetic": "f3efc9bb8dec",
    "calendar_arithmetic": "8ac3e2341fa0",
    "binary_matrix": "e5e365336bcb",
}


def scorer_source(task: str) -> str:
    dataset = dataset_for(ProblemSpec(dataset=task, config=EASY_CONFIGS[task], seed=0, index=0))
    return textwrap.dedent(inspect.getsource(type(dataset).score_answer))


def calls_eval_or_exec(source: str) -> bool:
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"eval", "exec"}
        for node in ast.walk(ast.parse(source))
    )


def test_which_pinned_reasoning_gym_scorers_run_their_answer_as_code():
    assert reasoning_gym_version() == "0.1.25", "a new reasoning-gym: re-read its scorers, then re-pin below"
    evaluating = {task for task in PAPER_TASKS if calls_eval_or_exec(scorer_source(task))}
    assert evaluating == EVALUATES_ITS_ANSWER


def test_the_nine_reasoning_gym_scorers_are_the_ones_task_scorers_was_written_against():
    digests = {task: hashlib.sha256(scorer_source(task).encode()).hexdigest()[:12] for task in PAPER_TASKS}
    assert digests == SCORER_DIGESTS


def test_other_reasoning_gym_scorers_that_eval_are_known():
    """Tasks off the allowlist today, which a future task choice must not bring in unread."""
    root = Path(reasoning_gym.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.FunctionDef)
                and node.name == "score_answer"
                and calls_eval_or_exec(ast.unparse(node))
            ):
                found.add(path.stem)
    assert {"binary_matrix", "n_queens", "spiral_matrix", "string_insertion"} <= found


def test_the_node_never_calls_a_reasoning_gym_scorer(monkeypatch):
    """Scoring goes through our grammars only: with every reasoning-gym scorer broken, it scores the same."""
    problems = [problem_for(task, i) for task in PAPER_TASKS for i in range(5)]
    answers = [p.answer if p.spec.dataset != "propositional_logic" else p.metadata["example_answer"] for p in problems]
    expected = [score_completion(p, f"<answer>{a}</answer>") for p, a in zip(problems, answers)]
    for task in PAPER_TASKS:
        monkeypatch.setattr(type(dataset_for(problem_for(task).spec)), "score_answer", _never)
    assert [score_completion(p, f"<answer>{a}</answer>") for p, a in zip(problems, answers)] == expected
    assert sum(expected) >= 40  # the keys themselves: right (propositional_logic's may be trivial: 0.25)


def _never(*args, **kwargs):
    raise AssertionError("a reasoning-gym scorer was called on a stranger's text")
