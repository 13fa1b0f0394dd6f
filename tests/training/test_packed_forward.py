"""The update's packed forward (training/decoder/packed_forward.py): the model's own log-probs and
gradients, with no padding, each group's prompt once, and the frozen base multiplied in bf16
when asked."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

import sapo.training.learning.update as update
from sapo.training.config import TrainingSettings
from sapo.training.decoder.packed_forward import PackedForward, fits, pack_rows, unpack
from sapo.training.learning.update import completion_logprobs, grpo_update
from sapo.training.models.policy import LoraOptions, load_policy
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs
from tests.support.rows import encode_groups, rows_of

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def problems():
    return TaskSampler(default_task_specs(["basic_arithmetic"]), 3, 3).sample(2)


def groups_of(problems) -> list[QuestionGroup]:
    return [
        QuestionGroup(
            problem=problems[0],
            completions=["<answer>5</answer>", "I think it is <answer>12</answer>", "7"],
            rewards=[1.0, 0.0, 0.0],
            origin="peer",
        ),
        QuestionGroup(
            problem=problems[1], completions=["<answer>55</answer> yes", "x"], rewards=[1.0, 0.0], origin="peer"
        ),
    ]


def policy_of(name: str, lora: bool, tmp_path: Path):
    policy = load_policy(
        name, device="cpu", seed=0, models_dir=tmp_path, lora=LoraOptions() if lora else None, precision="fp32"
    )  # exactness against the model's own fp32 forward
    if lora:  # B starts at zero; give the adapter an effect, so that its part of the forward shows
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(1)
            for name_, parameter in policy.model.named_parameters():
                if "lora_B" in name_:
                    parameter.normal_(0, 0.05)
    return policy


def weighted_sum_and_grad(policy, logprobs, mask):
    policy.model.zero_grad(set_to_none=True)
    weights = torch.linspace(0.5, 2.0, mask.shape[1])
    value = (logprobs * mask * weights).sum()
    value.backward()
    return value.detach(), torch.cat([p.grad.flatten() for p in policy.trainable_parameters()])


@pytest.mark.parametrize("name, lora", [("tiny", False), ("tiny", True), ("tiny-bpe", True)])
def test_packed_rows_give_the_models_own_logprobs_and_gradient(problems, tmp_path, name, lora):
    policy = policy_of(name, lora, tmp_path)
    assert fits(policy.model)
    batch = encode_groups(policy, groups_of(problems))
    rows = list(range(len(batch.completions)))
    reference = completion_logprobs(policy.model, batch.input_ids, batch.attention_mask, batch.completion_length)
    expected_value, expected_grad = weighted_sum_and_grad(policy, reference, batch.completion_mask)

    packed = pack_rows(batch.prompts, batch.completions, batch.group_of, rows)
    # each group's prompt once, then its rows' completions: no padding anywhere
    assert len(packed.ids) == sum(map(len, batch.prompts)) + sum(map(len, batch.completions))
    logprobs, mask = unpack(PackedForward(policy.model).logprobs(packed, CPU), packed.lengths)
    assert torch.equal(mask, batch.completion_mask)
    value, grad = weighted_sum_and_grad(policy, logprobs, mask)
    assert torch.allclose(logprobs[mask.bool()], reference[mask.bool()], atol=1e-5)
    assert torch.allclose(value, expected_value, rtol=1e-5)
    assert torch.allclose(grad, expected_grad, atol=1e-5, rtol=1e-4)
    assert expected_grad.abs().max() > 1e-3


def test_bf16_multiplies_the_frozen_base_in_bf16_and_keeps_fp32_logprobs_and_lora(problems, tmp_path):
    policy = policy_of("tiny", True, tmp_path)
    batch = encode_groups(policy, groups_of(problems))
    packed = pack_rows(batch.prompts, batch.completions, batch.group_of, list(range(len(batch.completions))))
    forward = PackedForward(policy.model, torch.bfloat16)
    assert all(layer.qkv.frozen.dtype == torch.bfloat16 for layer in forward.layers)
    assert forward.lm_head.frozen.dtype == torch.float32  # logits stay fp32
    low, mask = unpack(forward.logprobs(packed, CPU), packed.lengths)
    exact, _ = unpack(PackedForward(policy.model).logprobs(packed, CPU), packed.lengths)
    assert low.dtype == torch.float32
    difference = (low - exact)[mask.bool()].abs().max()
    assert 0 < difference < 0.05  # bf16 rounding: visible, and small
    (low * mask).sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in policy.trainable_parameters())
    assert all(p.grad is None for p in policy.model.parameters() if not p.requires_grad)


def test_rows_of_a_group_must_be_adjacent(problems, tmp_path):
    policy = policy_of("tiny", False, tmp_path)
    batch = encode_groups(policy, groups_of(problems))
    with pytest.raises(ValueError, match="not adjacent"):
        pack_rows(batch.prompts, batch.completions, batch.group_of, [0, 3, 1])


def test_passes_keep_the_rows_order_and_split_groups_at_the_budget(problems, tmp_path):
    policy = policy_of("tiny", False, tmp_path)
    batch = encode_groups(policy, groups_of(problems))
    rows = list(range(len(batch.completions)))
    forward = PackedForward(policy.model)
    whole = update.PassLayout(batch, 64, False, forward)
    assert whole.pieces(rows) == [rows]
    per_token, per_logit = update.activation_bytes(forward.config)
    # room for about one row at a time: every pass one row, in order, its group's prompt with it
    tight = update.PassLayout(batch, 64, False, forward, budget=per_token * 40 + per_logit * 20)
    assert [r for piece in tight.pieces(rows) for r in piece] == rows and len(tight.pieces(rows)) > 2
    assert update.PassLayout(batch, 2, False, forward).pieces(rows) == [[0, 1], [2, 3], [4]]  # a pass spans groups


def test_an_update_runs_each_real_token_once_and_moves_the_weights_as_the_models_own_forward(
    problems, tmp_path, monkeypatch
):
    """One SGD step on packed rows equals the step on the model's own padded forward, and the
    packed step runs exactly the prompts (once each) and the completions."""
    settings = TrainingSettings(lr=1e-3, max_new_tokens=64, minibatches=1, updates_per_batch=1)
    moved, positions = {}, {}
    for packed in (True, False):
        policy = policy_of("tiny", False, tmp_path)
        rows = rows_of(policy, groups_of(problems))
        if not packed:
            monkeypatch.setattr(update, "fits", lambda model: False)
        seen = []
        hook = policy.model.get_input_embeddings().register_forward_pre_hook(
            lambda m, args: seen.append(args[0].numel())
        )
        before = torch.cat([p.detach().flatten().clone() for p in policy.model.parameters()])
        grpo_update(policy, torch.optim.SGD(policy.trainable_parameters(), lr=1.0), rows, settings, random.Random(0))
        hook.remove()
        moved[packed] = torch.cat([p.detach().flatten() for p in policy.model.parameters()]) - before
        positions[packed] = sum(seen)
    batch = encode_groups(policy_of("tiny", False, tmp_path), groups_of(problems))
    assert positions[True] == sum(map(len, batch.prompts)) + sum(map(len, batch.completions)) < positions[False]
    assert moved[True].abs().max() > 1e-3
    assert torch.allclose(moved[True], moved[False], atol=1e-5, rtol=1e-3)
