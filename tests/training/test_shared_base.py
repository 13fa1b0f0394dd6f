"""Several nodes on one base model: one copy of the base, one adapter, optimizer and checkpoint per
node, and their generation as one mixed batch that samples what each node would sample alone."""

from __future__ import annotations

import pytest
import torch

from sapo.training.decoder.decoding import decode_mixed, decode_samples
from sapo.training.models.policy import LoraOptions, load_policy
from sapo.training.models.shared_base import SharedLoraBase

PROMPTS = [["1+2=", "3+4=", "9+9="], ["2+2=", "5+1="], ["7+1=", "4+4=", "6+3=", "0+8="]]


@pytest.fixture
def shared(tmp_path) -> SharedLoraBase:
    base = SharedLoraBase(
        "tiny",
        3,
        lora=LoraOptions(rank=4, alpha=8),
        seeds=[0, 1, 2],
        models_dir=tmp_path,
        device="cpu",
        generation_precision="fp32",
    )
    # LoRA starts as B = 0 (every adapter the base); give each node a different one
    with torch.no_grad():
        for k, view in enumerate(base.views):
            generator = torch.Generator().manual_seed(100 + k)
            for name, parameter in view.named_parameters():
                if "lora_B" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return base


def test_one_base_copy_and_one_adapter_per_node(shared):
    views = shared.views
    owned = [{id(p) for p in v.parameters()} for v in views]
    assert all(owned) and not (owned[0] & owned[1]) and not (owned[1] & owned[2])
    base_count = sum(p.numel() for n, p in shared.model.named_parameters() if "lora_" not in n)
    assert sum(p.numel() for p in shared.model.parameters()) == base_count + sum(
        sum(p.numel() for p in v.parameters()) for v in views
    )
    views[2].activate()  # PEFT freezes the inactive adapters; each node still sees its own as trainable
    assert all(len(shared.policy(k).trainable_parameters()) == len(owned[k]) for k in range(3))
    assert not any(p.requires_grad for n, p in shared.model.named_parameters() if "lora_" not in n)


@pytest.mark.parametrize("temperature", [None, 1.0])
def test_a_mixed_batch_decodes_what_each_node_decodes_alone(shared, temperature):
    common = dict(
        samples_per_prompt=4,
        max_new_tokens=8,
        temperature=temperature,
        device=torch.device("cpu"),
        weights_dtype=torch.float32,
    )
    seeds = [11, 12, 13]
    together = decode_mixed(
        shared.model, shared.tokenizer, PROMPTS, [v.name for v in shared.views], seeds=seeds, **common
    )
    alone = [
        decode_samples(view, shared.tokenizer, prompts, seed=seed, **common)
        for view, prompts, seed in zip(shared.views, PROMPTS, seeds)
    ]
    assert [b.token_ids for b in together] == [b.token_ids for b in alone]
    assert [len(b.token_ids) for b in together] == [4 * len(p) for p in PROMPTS]
    # and the adapters matter: the nodes do not all decode what the first one would
    first_alone = decode_samples(shared.views[0], shared.tokenizer, PROMPTS[2], seed=seeds[2], **common)
    assert first_alone.token_ids != alone[2].token_ids


def test_training_one_node_moves_only_its_adapter(shared):
    before = {n: p.detach().clone() for n, p in shared.model.named_parameters()}
    view = shared.views[1]
    optimizer = torch.optim.Adam(list(view.parameters()), lr=1e-2)
    shared.views[0].activate()  # another node ran last
    ids = shared.tokenizer(["1+2=3"], return_tensors="pt")["input_ids"]
    loss = view(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    moved = {n for n, p in shared.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(".node1." in n for n in moved)


def test_a_nodes_adapter_saves_as_a_plain_lora_checkpoint(shared, tmp_path):
    view = shared.views[2]
    view.save_pretrained(tmp_path / "adapter")
    # the same base (a tiny model is built from a seed: the shared one's is the first node's)
    alone = load_policy(
        "tiny",
        device="cpu",
        seed=0,
        models_dir=tmp_path,
        lora=LoraOptions(rank=4, alpha=8),
        adapter_from=tmp_path / "adapter",
    )
    ids = shared.tokenizer(["3+4="], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(alone.model(input_ids=ids).logits, view(input_ids=ids).logits, atol=1e-5)
        assert not torch.allclose(shared.views[0](input_ids=ids).logits, view(input_ids=ids).logits, atol=1e-3)
