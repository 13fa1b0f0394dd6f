"""A node that shares its log-probs (--share-logprobs) records, while it samples, the log-prob of
each token it drew; a peer with the same tokenizer compares them with its own (--importance-weight).
They must be the sampling policy's real log-probs of the tokens the text re-encodes to, or the
weight measures nothing."""

from __future__ import annotations

import torch

from sapo.training.completions.generation import generate_groups
from sapo.training.learning.update import completion_logprobs, settle_old_logprobs
from sapo.training.learning.warmstart import WarmStartSettings, warm_start
from sapo.training.models.policy import load_policy
from sapo.training.problems.tasks import TaskSampler, default_task_specs
from tests.support.rows import encode_groups

TASKS = default_task_specs(["basic_arithmetic"])


def test_recorded_logprobs_are_the_policys_own_and_give_weight_one_to_itself(tmp_path):
    torch.set_num_threads(1)
    policy = load_policy("tiny", device="cpu", seed=0, models_dir=tmp_path, generation_precision="fp32")
    # A little warm start, so samples are text: an untrained model also draws <pad>, which the
    # decoded text drops, and such a completion (its group's behavior with it) is not comparable.
    warm_start(policy, TASKS, WarmStartSettings(steps=150, tag_rate=1.0))
    problems = TaskSampler(TASKS, dataset_seed=3, rng_seed=3).sample(3)
    result = generate_groups(policy, problems, num_generations=4, max_new_tokens=24, seed=5, record_behavior=True)
    plain = generate_groups(policy, problems, num_generations=4, max_new_tokens=24, seed=5)
    assert [g.completions for g in plain.groups] == [g.completions for g in result.groups], (
        "recording changes no sample"
    )
    assert all(g.behavior is None for g in plain.groups)

    for group in result.groups:
        assert group.behavior is not None
        assert group.behavior.tokenizer == policy.tokenizer_fingerprint and group.behavior.temperature == 1.0
        for text, row in zip(group.completions, group.behavior.token_logprobs):
            assert len(row) == len(policy.tokenizer(text, add_special_tokens=False)["input_ids"])

    # The same groups seen as a peer's: the receiver (here the same policy) re-encodes the text
    # and finds the sender's log-probs equal to its own, so each weight is 1.
    # (Rewards set so that every group has a signal and trains.)
    from_peer = [
        g.model_copy(update={"origin": "12D3KooWpeer", "rewards": [1.0, 0.0, 0.0, 0.0]}) for g in result.groups
    ]
    batch = encode_groups(policy, from_peer, 24, importance_weight="sequence")
    assert batch is not None
    compared = [row for row, sender in enumerate(batch.behavior) if sender is not None]
    assert compared, "rows of a peer with our tokenizer carry its log-probs into the update"
    ids, attention, _ = batch.padded(list(range(len(batch.completions))))
    with torch.no_grad():
        ours = completion_logprobs(policy.model, ids, attention, batch.completion_length)
    for row in compared:
        sender = torch.tensor(batch.behavior[row])
        assert torch.allclose(ours[row, : len(sender)], sender, atol=1e-3), (ours[row, : len(sender)], sender)
    old, weights = torch.zeros_like(ours), torch.ones(len(batch.completions))
    settle_old_logprobs(batch, old, weights, compared, ours[compared])
    assert torch.allclose(weights[compared], torch.ones(len(compared)), atol=1e-2)
