import random
from pathlib import Path

import pytest
import torch

from sapo.training.config import TrainingSettings
from sapo.training.learning.update import (
    EncodedBatch,
    auto_micro_batch_size,
    completion_logprobs,
    grpo_update,
    make_optimizer,
    settle_old_logprobs,
    shared_prompt_logprobs,
)
from sapo.training.models.policy import load_policy
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs
from tests.support.rows import encode_groups, rows_of


@pytest.fixture(scope="module")
def problem():
    return TaskSampler(default_task_specs(["basic_arithmetic"]), 3, 3).sample(1)[0]


def policy(name: str, tmp_path: Path, precision: str = "auto"):
    return load_policy(name, device="cpu", seed=0, models_dir=tmp_path, precision=precision)


def group(problem, completions, rewards, origin="peer"):
    return QuestionGroup(problem=problem, completions=completions, rewards=rewards, origin=origin)


def test_padded_batch_logprobs_equal_unpadded_ones(problem, tmp_path):
    pol = policy("tiny", tmp_path)
    g = group(problem, ["<answer>5</answer>", "I think it is <answer>12</answer>", "7"], [1.0, 0.0, 0.0])
    batch = encode_groups(pol, [g], max_completion_tokens=64)
    with torch.no_grad():
        padded = completion_logprobs(pol.model, batch.input_ids, batch.attention_mask, batch.completion_length)
        for row in range(3):
            keep = batch.attention_mask[row].bool()
            ids = batch.input_ids[row][keep].unsqueeze(0)
            n = int(batch.completion_mask[row].sum())
            logits = pol.model(input_ids=ids).logits[0, :-1].float()
            naive = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)[-n:]
            assert torch.allclose(padded[row, :n], naive, atol=1e-5)


def test_a_pass_is_padded_to_its_own_longest_row(problem, tmp_path):
    # The update runs a group (or a micro-batch) at a time; padding each to the round's longest
    # row would spend a forward and backward pass on every padded position.
    pol = policy("tiny", tmp_path)
    short = group(problem, ["<answer>5</answer>", "7"], [1.0, 0.0])
    long = group(problem, ["<answer>5</answer>" + " because five" * 4, "<answer>6</answer>"], [1.0, 0.0])
    batch = encode_groups(pol, [short, long], max_completion_tokens=128)
    short_rows = [r for r, g in enumerate(batch.group_of) if g == 0]
    narrow = max(len(batch.completions[r]) for r in short_rows)
    assert batch.width_of(short_rows) == narrow < batch.completion_length
    ids, mask = batch.completion_rows(short_rows)
    assert ids.shape[1] == narrow and mask[:, -1].any()
    ids, attention, mask = batch.padded(short_rows)
    assert mask.shape[1] == narrow and mask[:, -1].any() and attention[:, -1].any()
    assert batch.completion_mask.shape[1] == batch.completion_length  # the whole batch, as before


def test_peer_text_is_re_encoded_with_our_own_tokenizer(problem, tmp_path):
    char, bpe = policy("tiny", tmp_path), policy("tiny-bpe", tmp_path)
    text = "<answer>42</answer>"
    g = group(problem, [text, "<answer>7</answer>"], [1.0, 0.0])
    for pol in (char, bpe):
        batch = encode_groups(pol, [g], max_completion_tokens=64)
        n = int(batch.completion_mask[0].sum())
        ids = batch.input_ids[0, -batch.completion_length :][:n].tolist()
        assert ids[-1] == pol.tokenizer.eos_token_id  # a finished answer ends the sequence
        assert pol.tokenizer.decode(ids[:-1]) == text
    assert len(encode_groups(char, [g], 64).input_ids[0]) != len(encode_groups(bpe, [g], 64).input_ids[0])


def test_zero_signal_groups_are_left_out(problem, tmp_path):
    pol = policy("tiny", tmp_path)
    assert encode_groups(pol, [group(problem, ["a", "b"], [0.0, 0.0])], 16) is None


@pytest.mark.parametrize("learner", ["tiny", "tiny-bpe"])
def test_training_on_a_peers_text_raises_its_good_completion(problem, tmp_path, learner):
    pol = policy(learner, tmp_path)
    good, bad = f"<answer>{problem.answer}</answer>", "<answer>-99</answer>"
    g = group(problem, [good, bad, bad, bad], [1.0, 0.0, 0.0, 0.0])

    def logprob_of(text):
        batch = encode_groups(pol, [group(problem, [text, bad], [1.0, 0.0])], 64)
        with torch.no_grad():
            lp = completion_logprobs(pol.model, batch.input_ids, batch.attention_mask, batch.completion_length)
        return float((lp[0] * batch.completion_mask[0]).sum())

    before_good, before_bad = logprob_of(good), logprob_of(bad)
    settings = TrainingSettings(lr=1e-3, max_new_tokens=64)
    optimizer = make_optimizer(pol, settings)
    for _ in range(3):
        stats = grpo_update(
            pol, optimizer, rows_of(pol, [g]), settings, random.Random(0)
        )  # the peer's failures train too
    assert not stats.skipped and stats.sequences == 4
    assert logprob_of(good) > before_good + 0.5
    assert logprob_of(bad) < before_bad


def test_micro_batches_change_memory_not_the_update(problem, tmp_path):
    """Gradient accumulation over micro-batches gives the same step as one big pass. (Plain SGD
    shows the gradient itself; Adam would amplify float rounding in near-zero coordinates.)"""
    g = group(
        problem,
        ["<answer>5</answer>", "<answer>1</answer> and more text", "no tag", "<answer>55</answer>"],
        [1.0, 0.0, 0.0, 0.5],
    )
    results = []
    for micro in (1, 3, 64):
        # fp32: in bf16 a pass's rounding depends on its shape, so passes of other sizes differ by it
        pol = policy("tiny", tmp_path, precision="fp32")
        settings = TrainingSettings(lr=1e-3, max_new_tokens=64, micro_batch_size=micro, minibatches=1)
        grpo_update(
            pol, torch.optim.SGD(pol.trainable_parameters(), lr=1.0), rows_of(pol, [g]), settings, random.Random(0)
        )
        results.append(torch.cat([p.detach().flatten() for p in pol.model.parameters()]))
    assert torch.allclose(results[0], results[2], atol=1e-5)
    assert torch.allclose(results[1], results[2], atol=1e-5)
    initial = torch.cat([p.detach().flatten() for p in policy("tiny", tmp_path).model.parameters()])
    assert (results[2] - initial).abs().max() > 1e-3  # the step did move the weights


@pytest.mark.parametrize("name", ["tiny", "tiny-bpe"])
def test_shared_prompt_pass_gives_the_padded_pass_logprobs_and_gradient(problem, tmp_path, name):
    pol = policy(name, tmp_path)
    g = group(
        problem, ["<answer>5</answer>", "I think it is <answer>12</answer>", "7", "<answer>1"], [1.0, 0.0, 0.0, 0.5]
    )
    batch = encode_groups(pol, [g], max_completion_tokens=64)
    rows = list(range(4))
    weights = torch.linspace(0.5, 2.0, batch.completion_length)

    def loss_and_grad(logprobs):
        pol.model.zero_grad(set_to_none=True)
        value = (logprobs * batch.completion_mask * weights).sum()
        value.backward()
        return value.detach(), torch.cat([p.grad.flatten() for p in pol.model.parameters() if p.grad is not None])

    padded_value, padded_grad = loss_and_grad(
        completion_logprobs(pol.model, batch.input_ids, batch.attention_mask, batch.completion_length)
    )
    ids, _ = batch.completion_rows(rows)
    shared_value, shared_grad = loss_and_grad(shared_prompt_logprobs(pol.model, batch.prompts[0], ids))
    assert torch.allclose(shared_value, padded_value, atol=1e-4)
    assert torch.allclose(shared_grad, padded_grad, atol=1e-4, rtol=1e-3)
    assert padded_grad.abs().max() > 1e-3


def test_shared_prompt_update_of_groups_of_unlike_lengths_is_the_padded_update(problem, tmp_path, monkeypatch):
    # The shared-prompt path runs each group at its own width; the plain path pads every row to
    # the round's longest completion in one pass. One SGD step must come out the same.
    other = TaskSampler(default_task_specs(["basic_arithmetic"]), 4, 4).sample(1)[0]
    groups = [
        group(problem, ["<answer>5</answer>", "7", "<answer>12"], [1.0, 0.0, 0.5]),
        group(other, ["<answer>3</answer> since three" * 3, "no", "<answer>4</answer>"], [1.0, 0.0, 0.0]),
    ]
    settings = TrainingSettings(lr=1e-3, max_new_tokens=128, minibatches=1, updates_per_batch=1)
    moved = {}
    for shared in (True, False):
        monkeypatch.setattr(EncodedBatch, "shared_prompt_saves", lambda self, shared=shared: shared)
        pol = policy("tiny", tmp_path)
        before = torch.cat([p.detach().flatten().clone() for p in pol.model.parameters()])
        grpo_update(
            pol, torch.optim.SGD(pol.trainable_parameters(), lr=1.0), rows_of(pol, groups), settings, random.Random(0)
        )
        moved[shared] = torch.cat([p.detach().flatten() for p in pol.model.parameters()]) - before
    assert moved[True].abs().max() > 1e-3
    assert torch.allclose(moved[True], moved[False], atol=1e-5, rtol=1e-3)


def test_auto_micro_batch_fits_a_tiny_round_and_splits_a_large_model(problem, tmp_path):
    from transformers import LlamaConfig

    pol = policy("tiny", tmp_path)
    batch = encode_groups(pol, [group(problem, ["<answer>5</answer>"] * 4 + ["x"] * 4, [1.0] * 4 + [0.0] * 4)], 64)
    assert auto_micro_batch_size(pol.model, batch) >= 64

    class Large:  # SmolLM2-135M's shape, with a 300-token prompt and 256-token completions
        config = LlamaConfig(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, vocab_size=49152)

    long = type(batch)([[1] * 300], [[1] * 256] * 8, [0] * 8, batch.advantages, 0)
    assert 1 <= auto_micro_batch_size(Large, long) <= 4


def test_importance_weight_of_a_peers_completion_by_hand(problem, tmp_path):
    """min(1, exp(mean(log p_ours - log p_sender))) for a peer's rows with comparable log-probs;
    1 for our own rows, for rows without them and for another tokenizer's."""
    from sapo.training.problems.rollouts import Behavior

    pol = policy("tiny", tmp_path)
    texts = ["<answer>7</answer>", "<answer>8</answer>"]
    ids = [pol.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    likelier = [0.0] * len(ids[0])  # the sender was sure of every token: we are less so
    unlikely = [-30.0] * len(ids[1])  # the sender found it far less likely than we do
    behavior = Behavior(tokenizer=pol.tokenizer_fingerprint, temperature=1.0, token_logprobs=[likelier, unlikely])
    peer = group(problem, texts, [1.0, 0.0]).model_copy(update={"behavior": behavior})
    weigh = {"importance_weight": "sequence"}
    batch = encode_groups(pol, [peer], 64, **weigh)
    assert [b is not None for b in batch.behavior] == [True, True]
    assert encode_groups(pol, [peer], 64).behavior == (None, None)  # importance weighting off: no weights
    ids_, attention, _ = batch.padded(range(2))
    with torch.no_grad():
        ours = completion_logprobs(pol.model, ids_, attention, batch.completion_length)
    old, weights = torch.zeros_like(ours), torch.ones(2)
    settle_old_logprobs(batch, old, weights, [1], ours[[1]])
    assert weights.tolist() == [1.0, 1.0]  # only the rows settled get a weight; row 1's is truncated at 1
    settle_old_logprobs(batch, old, weights, [0], ours[[0]])
    expected = torch.exp(ours[0, : len(likelier)].mean()).item()
    assert weights[0].item() == pytest.approx(expected, rel=1e-5) and 0 < expected < 1
    assert torch.equal(old, ours)

    other = behavior.model_copy(update={"tokenizer": "another-tokenizer"})
    assert encode_groups(pol, [peer.model_copy(update={"behavior": other})], 64, **weigh).behavior == (None, None)
    local = peer.model_copy(update={"origin": "local"})  # our own rows are on-policy: no weight
    assert encode_groups(pol, [local], 64, **weigh).behavior == (None, None)
