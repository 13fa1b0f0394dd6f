import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from sapo.training.models.sources import TINY_VARIANTS, is_tiny
from sapo.training.models.tiny import build_tiny

TEXT = "Calculate 7 - 9.\n<answer>-2</answer>"

# (low, high) parameter counts each variant promises.
PARAM_RANGES = {
    "tiny": (0.8e6, 1.3e6),
    "tiny-micro": (0.1e6, 0.2e6),
    "tiny-small": (0.3e6, 0.7e6),
    "tiny-large": (8e6, 12e6),
    "tiny-bpe": (0.8e6, 1.5e6),
    "tiny-micro-bpe": (0.1e6, 0.25e6),
}


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def logits(model, tokenizer, text=TEXT):
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        return model(ids).logits


def test_every_variant_has_a_param_range():
    assert set(PARAM_RANGES) == set(TINY_VARIANTS)


@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
def test_variant_shape(variant):
    model, tokenizer = build_tiny(variant, seed=0)
    assert isinstance(model, LlamaForCausalLM)
    low, high = PARAM_RANGES[variant]
    assert low <= n_params(model) <= high
    config = model.config
    assert config.vocab_size == len(tokenizer)
    assert config.max_position_embeddings >= 512
    assert config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert next(model.parameters()).dtype == torch.float32
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<pad>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert config.eos_token_id == tokenizer.eos_token_id
    assert config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert logits(model, tokenizer).shape[-1] == len(tokenizer)


@pytest.mark.parametrize("variant", ["tiny", "tiny-bpe"])
def test_same_seed_same_weights_other_seed_differs(variant):
    a, _ = build_tiny(variant, seed=3)
    b, _ = build_tiny(variant, seed=3)
    c, _ = build_tiny(variant, seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])


def test_build_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny("tiny-small", seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_char_and_bpe_tokenizers_differ():
    _, char = build_tiny("tiny", seed=0)
    _, bpe = build_tiny("tiny-bpe", seed=0)
    assert len(char) == 101  # 97 characters + 4 special tokens
    assert len(bpe) == 1024
    char_ids, bpe_ids = char(TEXT)["input_ids"], bpe(TEXT)["input_ids"]
    assert len(char_ids) == len(TEXT)  # one token per character
    assert len(bpe_ids) < len(char_ids)  # merges learned from the corpus
    assert char_ids != bpe_ids
    assert char.decode(char_ids) == bpe.decode(bpe_ids) == TEXT


@pytest.mark.parametrize(
    "text",
    [TEXT, "  two  spaces\tand tab\n\nend ", "~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./", ""],
)
def test_char_tokenizer_decodes_exactly(text):
    _, tokenizer = build_tiny("tiny", seed=0)
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id not in ids


def test_char_tokenizer_maps_unknown_chars_to_unk():
    _, tokenizer = build_tiny("tiny", seed=0)
    ids = tokenizer("a\u00e9\u4e2db")["input_ids"]
    assert ids == [
        tokenizer.convert_tokens_to_ids("a"),
        tokenizer.unk_token_id,
        tokenizer.unk_token_id,
        tokenizer.convert_tokens_to_ids("b"),
    ]


def test_bpe_tokenizer_is_lossless_on_any_text():
    _, tokenizer = build_tiny("tiny-bpe", seed=0)
    text = "caf\u00e9 \u4e2d\u6587 \U0001f600\n<answer>42</answer>"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


@pytest.mark.parametrize("variant", ["tiny", "tiny-bpe"])
def test_special_tokens_and_chat_template(variant):
    _, tokenizer = build_tiny(variant, seed=0)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text)["input_ids"]
    assert ids.count(tokenizer.eos_token_id) == 1  # <|im_end|> is one token, not split
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nWhat is 2+3?\nassistant\n"


@pytest.mark.parametrize("variant", ["tiny", "tiny-bpe"])
def test_save_and_reload_round_trip(variant, tmp_path):
    model, tokenizer = build_tiny(variant, seed=7)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model2 = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer2 = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(model2, LlamaForCausalLM)
    assert tokenizer2(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]
    assert tokenizer2.decode(tokenizer2(TEXT)["input_ids"]) == TEXT
    assert tokenizer2.eos_token == tokenizer.eos_token
    assert tokenizer2.pad_token == tokenizer.pad_token
    assert tokenizer2.chat_template == tokenizer.chat_template
    assert torch.equal(logits(model2, tokenizer2), logits(model, tokenizer))


def test_unknown_variant_names_the_valid_ones():
    with pytest.raises(ValueError) as error:
        build_tiny("tiny-huge", seed=0)
    for name in TINY_VARIANTS:
        assert name in str(error.value)


def test_is_tiny():
    assert all(is_tiny(name) for name in TINY_VARIANTS)
    assert not is_tiny("smollm2-135m-instruct")
    assert not is_tiny("tiny-huge")


# Run both here and in a fresh interpreter, so it is source text.
FINGERPRINT = """
import hashlib
from sapo.training.models.tiny import build_tiny

def fingerprint(variant, seed):
    model, tokenizer = build_tiny(variant, seed)
    digest = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()
"""


def test_bpe_tokenizer_and_weights_identical_across_processes():
    # Peers build tiny-bpe independently, so BPE training must not depend on per-process hash
    # seeds (Python's or the Rust HashMaps' inside `tokenizers`).
    here = {}
    exec(FINGERPRINT, here)
    script = FINGERPRINT + "import sys; print(fingerprint(sys.argv[1], int(sys.argv[2])))"
    out = subprocess.run(
        [sys.executable, "-c", script, "tiny-bpe", "5"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert out.stdout.strip().splitlines()[-1] == here["fingerprint"]("tiny-bpe", 5)
