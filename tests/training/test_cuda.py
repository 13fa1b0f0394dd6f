"""The training path on a CUDA GPU: the CPU tests' claims, checked where most users train.

Marked `cuda` and skipped without a GPU; bench/gpu_check.py runs them first on a GPU box
(`pytest -m cuda tests/`). A tiny model, so they take seconds there.
"""

from __future__ import annotations

import random

import pytest
import torch

from sapo.training.config import TrainingSettings
from sapo.training.decoder.decoding import LlamaDecoder, _StaticDecoding, decode_mixed, decode_samples, sample_tokens
from sapo.training.learning.update import completion_logprobs, grpo_update, make_optimizer
from sapo.training.models.policy import LoraOptions, load_policy
from sapo.training.models.shared_base import SharedLoraBase
from sapo.training.models.tiny import build_tiny
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs
from tests.support.rows import encode_groups, rows_of

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda", 0)
PROMPTS = [
    "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is 17 - 5? Think, then answer in tags.<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def tiny():
    """The CPU decoding tests' tiny model (a few random steps off the seeded init, so greedy paths
    differ between prompts), on the GPU, and a CPU copy of it."""
    model, tokenizer = build_tiny("tiny", 3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    cpu = build_tiny("tiny", 3)[0]
    cpu.load_state_dict(model.state_dict())
    return model.to(CUDA).eval(), cpu.eval(), tokenizer


@pytest.fixture(scope="module")
def problem():
    return TaskSampler(default_task_specs(["basic_arithmetic"]), 3, 3).sample(1)[0]


def encode(tokenizer, prompts, device):
    tokenizer.padding_side = "left"
    return tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)


def teacher_forced_logits(model, tokenizer, device, continuation, dtype=torch.float32):
    """LlamaDecoder's logits for `continuation` [rows, n] after the prompts, and the model's own
    forward over the same sequences, on `device`: both [rows, n, vocab]."""
    enc = encode(tokenizer, PROMPTS, device)
    ids, attention, continuation = enc["input_ids"], enc["attention_mask"], continuation.to(device)
    with torch.inference_mode():
        decoding = _StaticDecoding(LlamaDecoder.of(model, dtype), ids, attention, 1, continuation.shape[1])
        ours = [decoding.first_logits]
        for column in continuation.T[:-1]:
            ours.append(decoding.step(column))
        full = torch.cat([ids, continuation], 1)
        full_attention = torch.cat([attention, torch.ones_like(continuation)], 1)
        positions = (full_attention.cumsum(-1) - 1).clamp_min(0)
        reference = model(input_ids=full, attention_mask=full_attention, position_ids=positions).logits
    return torch.stack(ours, 1).float(), reference[:, ids.shape[1] - 1 : -1].float()


def test_auto_precision_on_cuda_is_bf16_for_the_update_and_for_sampling(tmp_path):
    policy = load_policy("tiny", device="cuda", seed=0, models_dir=tmp_path)
    assert policy.device == CUDA
    assert policy.bf16 and policy.generation_dtype == torch.bfloat16  # every card we target has bf16 units
    assert all(p.device == CUDA and p.dtype == torch.float32 for p in policy.model.parameters())


def test_bf16_update_on_cuda_runs_its_forward_in_bf16_and_trains_fp32_weights(tmp_path, problem):
    group = QuestionGroup(
        problem=problem,
        completions=[f"<answer>{problem.answer}</answer>", "<answer>-9</answer>"],
        rewards=[1.0, 0.0],
        origin="peer",
    )
    fp32 = load_policy("tiny", device="cuda", seed=0, models_dir=tmp_path, precision="fp32")
    bf16 = load_policy("tiny", device="cuda", seed=0, models_dir=tmp_path, precision="bf16")
    batch = encode_groups(fp32, [group], 32)
    seen = []
    hook = bf16.model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    with torch.no_grad():
        reference = completion_logprobs(
            fp32.model, batch.input_ids.to(CUDA), batch.attention_mask.to(CUDA), batch.completion_length
        )
        with bf16.autocast():
            low = completion_logprobs(
                bf16.model, batch.input_ids.to(CUDA), batch.attention_mask.to(CUDA), batch.completion_length
            )
    hook.remove()
    assert seen == [torch.bfloat16] and low.dtype == torch.float32
    mask = batch.completion_mask.bool().to(CUDA)
    assert (low[mask] - reference[mask]).abs().max() < 0.1  # bf16 keeps about 3 significant digits
    before = [p.detach().clone() for p in bf16.trainable_parameters()]
    settings = TrainingSettings(lr=1e-3)
    stats = grpo_update(bf16, make_optimizer(bf16, settings), rows_of(bf16, [group]), settings, random.Random(0))
    assert not stats.skipped and torch.isfinite(torch.tensor(stats.loss))
    assert any(not torch.equal(b, p) for b, p in zip(before, bf16.trainable_parameters()))
    assert all(p.dtype == torch.float32 and p.device == CUDA for p in bf16.model.parameters())


def test_greedy_decoding_on_cuda_matches_generate(tiny):
    model, _, tokenizer = tiny
    ours = decode_samples(
        model, tokenizer, PROMPTS, samples_per_prompt=1, max_new_tokens=24, temperature=None, seed=0, device=CUDA
    )
    enc = encode(tokenizer, PROMPTS, CUDA)
    with torch.inference_mode():
        out = model.generate(
            **enc,
            do_sample=False,
            max_new_tokens=24,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    special = {tokenizer.pad_token_id, tokenizer.eos_token_id}
    theirs = [[t for t in row.tolist() if t not in special] for row in out[:, enc["input_ids"].shape[1] :]]
    assert ours.token_ids == theirs
    assert len(set(map(tuple, ours.token_ids))) == 2  # the two prompts really lead to different text


def test_static_decoder_on_cuda_computes_what_it_computes_on_the_cpu(tiny):
    model, cpu, tokenizer = tiny
    continuation = torch.randint(4, len(tokenizer), (2, 40), generator=torch.Generator().manual_seed(0))
    ours, reference = teacher_forced_logits(model, tokenizer, CUDA, continuation)
    assert (ours - reference).abs().max() < 1e-4 * reference.abs().max()  # its own forward, fp32 on the GPU
    on_cpu, _ = teacher_forced_logits(cpu, tokenizer, torch.device("cpu"), continuation)
    assert (ours.cpu() - on_cpu).abs().max() < 1e-4 * on_cpu.abs().max()  # and what the CPU computes
    low, _ = teacher_forced_logits(model, tokenizer, CUDA, continuation, dtype=torch.bfloat16)
    p, q = torch.softmax(reference, -1), torch.softmax(low, -1)
    assert (p - q).abs().sum(-1).max() / 2 < 0.03  # bf16 on the GPU: total variation per position


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_sampler_on_cuda_draws_from_the_tempered_softmax(temperature):
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, float("-inf"), 3.0, -2.0], device=CUDA)
    draws = 40_000
    chosen = sample_tokens(logits.expand(draws, -1), temperature, torch.Generator(device=CUDA).manual_seed(7))
    assert chosen.device == CUDA and chosen.shape == (draws,)
    frequencies = torch.bincount(chosen, minlength=len(logits)).double().cpu() / draws
    expected = torch.softmax(logits.double().cpu() / temperature, -1)
    assert frequencies[5] == 0  # a -inf logit is never drawn
    error = (expected * (1 - expected) / draws).sqrt()
    assert ((frequencies - expected).abs() <= 5 * error + 1e-12).all()


def test_seeded_sampling_on_cuda_repeats_and_seeds_differ(tiny):
    model, _, tokenizer = tiny
    options = dict(samples_per_prompt=4, max_new_tokens=16, temperature=1.0, device=CUDA)
    first = decode_samples(model, tokenizer, PROMPTS, seed=3, **options).token_ids
    assert decode_samples(model, tokenizer, PROMPTS, seed=3, **options).token_ids == first
    assert decode_samples(model, tokenizer, PROMPTS, seed=4, **options).token_ids != first


@pytest.mark.parametrize("temperature", [None, 1.0])
def test_a_mixed_batch_on_cuda_decodes_what_each_node_decodes_alone(tmp_path, temperature):
    shared = SharedLoraBase(
        "tiny",
        3,
        lora=LoraOptions(rank=4, alpha=8),
        seeds=[0, 1, 2],
        models_dir=tmp_path,
        device="cuda",
        generation_precision="fp32",
    )
    with torch.no_grad():  # LoRA starts as B = 0 (every adapter the base); give each node its own
        for k, view in enumerate(shared.views):
            generator = torch.Generator().manual_seed(100 + k)
            for name, parameter in view.named_parameters():
                if "lora_B" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    prompts = [["1+2=", "3+4=", "9+9="], ["2+2=", "5+1="], ["7+1=", "4+4=", "6+3=", "0+8="]]
    common = dict(
        samples_per_prompt=4, max_new_tokens=8, temperature=temperature, device=CUDA, weights_dtype=torch.float32
    )
    seeds = [11, 12, 13]
    together = decode_mixed(
        shared.model, shared.tokenizer, prompts, [v.name for v in shared.views], seeds=seeds, **common
    )
    alone = [
        decode_samples(view, shared.tokenizer, p, seed=seed, **common)
        for view, p, seed in zip(shared.views, prompts, seeds)
    ]
    assert [b.token_ids for b in together] == [b.token_ids for b in alone]
    first_alone = decode_samples(shared.views[0], shared.tokenizer, prompts[2], seed=seeds[2], **common)
    assert first_alone.token_ids != alone[2].token_ids  # and the adapters matter
