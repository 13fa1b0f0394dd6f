"""bf16 autocast: chosen by device, and when on, forward passes run in bf16 while weights stay fp32."""

import random

import pytest
import torch

from sapo.training.config import TrainingSettings
from sapo.training.learning.update import completion_logprobs, grpo_update, make_optimizer
from sapo.training.models.policy import has_native_bf16, load_policy, use_bf16, use_bf16_generation
from sapo.training.problems.rollouts import QuestionGroup
from sapo.training.problems.tasks import TaskSampler, default_task_specs
from tests.support.rows import encode_groups, rows_of


def test_auto_update_precision_is_bf16_only_on_native_bf16_cpus_with_the_packed_forward(monkeypatch):
    cpu = torch.device("cpu")
    assert use_bf16("bf16", cpu) is True and use_bf16("fp32", cpu, packed=True) is False
    with pytest.raises(ValueError, match="precision"):
        use_bf16("fp16", cpu)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert use_bf16("auto", cpu, packed=True) is True
    assert use_bf16("auto", cpu, packed=False) is False  # autocast through the model's own forward: fp32
    assert use_bf16("auto", torch.device("mps"), packed=True) is False
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert use_bf16("auto", cpu, packed=True) is False  # an AVX2-only CPU emulates bf16: slower than fp32


def test_a_llama_family_policy_updates_in_bf16_where_the_cpu_has_it(tmp_path):
    cpu = torch.device("cpu")
    assert load_policy("tiny", device="cpu", seed=0, models_dir=tmp_path).bf16 is has_native_bf16(cpu)
    assert load_policy("tiny", device="cpu", seed=0, models_dir=tmp_path, precision="fp32").bf16 is False


def test_bf16_policy_runs_its_forward_in_bf16_and_keeps_fp32_weights(tmp_path):
    problem = TaskSampler(default_task_specs(["basic_arithmetic"]), 3, 3).sample(1)[0]
    group = QuestionGroup(
        problem=problem,
        completions=[f"<answer>{problem.answer}</answer>", "<answer>-9</answer>"],
        rewards=[1.0, 0.0],
        origin="peer",
    )
    fp32 = load_policy("tiny", device="cpu", seed=0, models_dir=tmp_path, precision="fp32")
    bf16 = load_policy("tiny", device="cpu", seed=0, models_dir=tmp_path, precision="bf16")
    batch = encode_groups(fp32, [group], 32)
    seen = []
    hook = bf16.model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    with torch.no_grad():
        reference = completion_logprobs(fp32.model, batch.input_ids, batch.attention_mask, batch.completion_length)
        with bf16.autocast():
            low = completion_logprobs(bf16.model, batch.input_ids, batch.attention_mask, batch.completion_length)
    hook.remove()
    assert seen == [torch.bfloat16] and low.dtype == torch.float32
    mask = batch.completion_mask.bool()
    assert (low[mask] - reference[mask]).abs().max() < 0.1  # bf16 keeps about 3 significant digits
    stats = grpo_update(
        bf16,
        make_optimizer(bf16, TrainingSettings(lr=1e-3)),
        rows_of(bf16, [group]),
        TrainingSettings(lr=1e-3),
        random.Random(0),
    )
    assert not stats.skipped and torch.isfinite(torch.tensor(stats.loss))
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())


def test_generation_precision_follows_the_hardware_unless_chosen(monkeypatch):
    cpu = torch.device("cpu")
    assert use_bf16_generation("fp32", cpu) is False and use_bf16_generation("bf16", cpu) is True
    assert use_bf16_generation("auto", cpu) is has_native_bf16(cpu)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert use_bf16_generation("auto", cpu) is False  # an AVX2-only CPU emulates bf16: slower than fp32
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert use_bf16_generation("auto", cpu) is True
    assert use_bf16_generation("auto", torch.device("mps")) is False
    with pytest.raises(ValueError, match="generation precision"):
        use_bf16_generation("fp16", cpu)


def test_bf16_generation_samples_on_bf16_weights_and_leaves_the_model_fp32(tmp_path, monkeypatch):
    from sapo.training.completions.generation import sample_completions
    from sapo.training.decoder import decoding

    policy = load_policy(
        "tiny", device="cpu", seed=0, models_dir=tmp_path, generation_precision="bf16", precision="fp32"
    )
    assert policy.generation_dtype == torch.bfloat16 and not policy.bf16  # the update keeps its own precision
    built, real_of = [], decoding.LlamaDecoder.of

    def recording_of(model, dtype, rows=32, adapters=None):
        built.append(real_of(model, dtype, rows, adapters))
        return built[-1]

    monkeypatch.setattr(decoding.LlamaDecoder, "of", recording_of)
    completions, tokens, _ = sample_completions(policy, ["1+1="], num_generations=2, max_new_tokens=4)
    assert tokens > 0 and len(completions[0]) == 2
    assert built[0].layers[0].qkv.dtype == torch.bfloat16 and built[0].lm_head.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())


def test_the_nodes_generation_precision_setting_reaches_its_policy(tmp_path):
    from sapo.node.core.node import Node
    from sapo.node.core.settings import load_settings

    for choice, bf16 in (("fp32", False), ("bf16", True)):
        settings = load_settings(
            {
                "model": "tiny-micro",
                "warm_start_steps": 0,
                "generation_precision": choice,
                "data_dir": tmp_path / choice,
                "torch_threads": 1,
                "checkpoint_every": 0,
            }
        )
        node = Node(settings)
        assert node.policy.generation_bf16 is bf16, choice
        assert node.policy.generation_dtype == (torch.bfloat16 if bf16 else torch.float32)
