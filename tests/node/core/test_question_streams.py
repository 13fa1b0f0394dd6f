"""Nodes with neighbouring seeds ask questions of their own (training/problems/tasks.py
`question_stream`).

ReasoningGYM draws item `index` of a dataset seeded `seed` from Random(seed + index), so a node
seeded 1 asked, at each index, what a node seeded 0 asked one index later: a study's nodes (seeds
base + k) and `make run`'s (seed + k) asked one another's questions, and in the specialists study
three in four of a node's questions had reached it from a peer first, answered, which its
cumulative accuracy then counted as learning (issue #42). Through the node's own `questions`,
the one step the daemon and the study share."""

from sapo.protocol.wire.messages import WireProblemSpec
from sapo.sampling.balance import RoundPlan
from sapo.training.problems.tasks import ProblemSpec, question_stream
from tests.support.tiny_nodes import tiny_node

ASKED = 200


def asked(node) -> list[str]:
    questions, _ = node.questions(RoundPlan(index=1, local=ASKED, external=0), node.start_state().streams.tasks)
    return [problem.question for problem in questions]


def test_nodes_with_neighbouring_seeds_do_not_ask_one_anothers_questions(tmp_path):
    first = asked(tiny_node(tmp_path / "a", seed=0))
    second = asked(tiny_node(tmp_path / "b", seed=1))
    # before: second[i] == first[i + 1] for every i, the same stream one question on
    shifted = sum(a == b for a, b in zip(first[1:], second, strict=False))
    print(f"shifted matches {shifted} of {ASKED - 1}")  # 199 of 199 before
    assert shifted <= ASKED // 20  # tiny-micro's short sums coincide by chance (80 of 200 texts in common)


def test_every_seed_s_stream_starts_past_any_other_s_last_question():
    # the wire's index is below 2^31 and a seed below 2^32: the streams never meet, and the
    # largest seed's last question still goes on the wire (its dataset seed below 2^63)
    last_index = 2**31 - 1
    for seed in (0, 1, 2**31, 2**32 - 2):
        assert question_stream(seed) + last_index < question_stream(seed + 1)
    spec = ProblemSpec(dataset="basic_arithmetic", config={}, seed=question_stream(2**32 - 1), index=last_index)
    assert WireProblemSpec.from_spec(spec).to_spec() == spec


def test_nodes_left_at_the_default_seed_ask_questions_of_their_own_and_keep_them_across_restarts(tmp_path):
    # Before, a node started without --seed was seed 0, as was every other: default nodes (a
    # compose swarm's, everyone's `sapo-node start`) asked one stream in step and sampled alike.
    alice = tiny_node(tmp_path / "a", peer_id="12D3KooWalice")
    bob = tiny_node(tmp_path / "b", peer_id="12D3KooWbob")
    assert alice.settings.seed != bob.settings.seed
    same_place = sum(a == b for a, b in zip(asked(alice), asked(bob), strict=True))
    print(f"questions in the same place: {same_place} of {ASKED}")  # 200 of 200 before
    assert same_place <= ASKED // 20
    # the identity outlives a restart, and so does the seed it gives; a seed that is given stays
    again = tiny_node(tmp_path / "a-again", peer_id="12D3KooWalice")
    assert again.settings.seed == alice.settings.seed and asked(again) == asked(alice)
    assert tiny_node(tmp_path / "c", peer_id="12D3KooWbob", seed=0).settings.seed == 0
