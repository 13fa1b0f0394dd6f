"""Tiny Llama-architecture causal LMs for tests and CPU-scale swarms.

A tiny model is built from a config with seeded random weights, so it needs no download and the
same (variant, seed) always gives the same weights. Its tokenizer is made in code too: either one
token per character, or a byte-level BPE trained at build time on ReasoningGYM text. Both speak
ChatML (<|im_start|>, <|im_end|>) like the SmolLM2 default, so the rest of the node treats every
model alike.
"""

from __future__ import annotations

import functools
import string

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from sapo.training.models.sources import TINY_VARIANTS, TinyVariant

PAD, UNK, IM_START, IM_END = "<pad>", "<unk>", "<|im_start|>", "<|im_end|>"
# Ids 0-3 in both tokenizers. <|im_start|> doubles as bos and <|im_end|> as eos, as in SmolLM2;
# pad is its own token so padding never hides a real end of turn.
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, IM_START, IM_END)

# Plain ChatML without SmolLM2's default system prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CHAR_ALPHABET: str = string.printable.replace("\x0b", "").replace("\x0c", "").replace("\r", "")


# Positions cover a ReasoningGYM prompt plus a few hundred generated tokens at one char per token.
MAX_POSITIONS = 1024


def _variant(name: str) -> TinyVariant:
    try:
        return TINY_VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown tiny model {name!r}; choose one of {', '.join(TINY_VARIANTS)}") from None


def build_tiny(variant: str, seed: int) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A freshly initialised tiny Llama and its tokenizer; the same seed gives the same weights.

    The model is fp32, in eval mode (as `from_pretrained` returns it), with tied embeddings.
    The global torch RNG is left as it was.
    """
    spec = _variant(variant)
    tokenizer = _tokenizer(spec.tokenizer, spec.bpe_vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer


def _tokenizer(kind: str, bpe_vocab_size: int) -> PreTrainedTokenizerFast:
    # A fresh wrapper each call (callers may add tokens); the backend JSON is built once.
    backend = Tokenizer.from_str(_backend_json(kind, bpe_vocab_size))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK if kind == "char" else None,
        bos_token=IM_START,
        eos_token=IM_END,
        chat_template=CHATML_TEMPLATE,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )


@functools.cache
def _backend_json(kind: str, bpe_vocab_size: int) -> str:
    if kind == "char":
        backend = _char_backend()
    elif kind == "bpe":
        backend = _bpe_backend(bpe_vocab_size)
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose char or bpe")
    return backend.to_str()


def _char_backend() -> Tokenizer:
    """One token per character of printable ASCII, newline and tab; anything else is <unk>."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in CHAR_ALPHABET:
        vocab[char] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # Every character is its own "word"; Fuse joins them back without the spaces WordLevel adds.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return backend


def _bpe_backend(vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on a fixed ReasoningGYM corpus: deterministic, and lossless."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(training_corpus(), trainer=trainer)
    return backend


def training_corpus(num_problems: int = 600) -> list[str]:
    """The fixed text the BPE tokenizer learns from: easy ReasoningGYM problems and the answers
    a policy should write, in the ChatML turns it will see. Changing it changes every tiny-bpe id.
    """
    from sapo.training.problems.tasks import TaskSampler, default_task_specs

    problems = TaskSampler(default_task_specs(), dataset_seed=0, rng_seed=0).sample(num_problems)
    corpus = []
    for problem in problems:
        corpus.append(f"{IM_START}user\n{problem.question}{IM_END}\n")
        corpus.append(f"{IM_START}assistant\n<answer>{problem.answer}</answer>{IM_END}\n")
    corpus += [f"<answer>{n}</answer>" for n in range(-20, 101)]
    return corpus
