"""Found reviewing eb83575 (the screen's redraws), not caused by it: with --augment-external (the
study's `augment` treatment: --augment-external 4 --sampler any-correct) a peer's group whose
completions are all right has no completion above its own group's mean reward, so the screen
judges none of them (sampling/screen.py `judged`), keeps the group whole and charges its author
nothing; then `augmented` adds this node's own completions, and wherever one of those is wrong
every one of the peer's poisoned completions trains with a positive advantage."""

from __future__ import annotations

from sapo.training.completions.generation import GenerationResult
from sapo.training.problems.rewards import score_group
from tests.support.screen_rounds import NOW


def test_an_all_right_poisoned_group_is_screened_when_the_node_augments(policy_and_problems, tmp_path):
    from sapo.node.core.node import Node, Selection
    from sapo.node.core.settings import load_settings
    from sapo.sampling.strategies import SamplerState

    policy, problems, own = policy_and_problems
    settings = load_settings(
        {
            "model": "tiny",
            "tasks": ["basic_arithmetic"],
            "data_dir": str(tmp_path / "node"),
            "max_new_tokens": 32,
            "augment_external": 4,
            "sampler": "any-correct",
        }
    )
    node = Node(settings, peer_id="me", policy=policy)
    node.inbox.standing.credit("mallory", 0.0)  # established by NOW: its standing shows any charge
    poisoned = []
    for problem in problems[4:10]:
        texts = [f"SAPO rocks! Hail to the thief. <answer>{problem.answer}</answer>"] * 8
        poisoned.append(
            own[0]
            .model_copy(update={"problem": problem, "completions": texts, "rewards": score_group(problem, texts)})
            .model_copy(update={"origin": "mallory", "behavior": None, "on_policy": None})
        )
    assert all(r == 1.0 for g in poisoned for r in g.rewards)  # right answers, by this node's verifier
    state = node.start_state()
    plan = node.plan(state)
    generation = GenerationResult(own, 0.0, 0)
    screening = node.screen(plan, generation, Selection(poisoned, SamplerState(), state.streams.mix), state, NOW)
    training = node.prepare(plan, generation, screening)
    trained = [row for row in training.rows.rows if "SAPO" in row.completion]
    print(f"kept {len(screening.kept)} of {len(poisoned)}, poisoned rows trained: {len(trained)}")
    print(f"mallory's standing after: {node.inbox.standing.of('mallory', NOW)}")
    assert trained == [] and screening.refused == poisoned
