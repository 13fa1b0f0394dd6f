"""What a `--model` value names, decided without importing torch: a tiny variant built in code,
the built-in SmolLM2, a local Hugging Face directory, or a hub id.

Settings are checked with this before anything heavy loads, and the loader uses the same rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"
# owner/name (or a legacy bare name such as gpt2): what the Hugging Face hub accepts as an id
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


@dataclass(frozen=True)
class TinyVariant:
    """One named tiny model: its tokenizer kind and Llama shape."""

    tokenizer: str  # "char" or "bpe"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    bpe_vocab_size: int = 0  # only for tokenizer="bpe"
    description: str = ""


TINY_VARIANTS: dict[str, TinyVariant] = {
    # name: TinyVariant(tokenizer, hidden, layers, heads, kv heads, mlp, ...)
    "tiny": TinyVariant("char", 128, 4, 4, 2, 512, description="1.0M params, char tokenizer"),
    "tiny-small": TinyVariant("char", 96, 4, 4, 2, 288, description="0.45M params, char tokenizer"),
    # The size of the CPU prototype that learned arithmetic from a warm start; 2 layers make it
    # about twice as fast per round as tiny-small, which is what an 8-node study on 2 cores needs.
    "tiny-micro": TinyVariant("char", 64, 2, 4, 2, 256, description="0.13M params, char tokenizer"),
    # tiny-micro's size with BPE tokens: an answer such as <answer>13</answer> is 7 tokens, not 19
    # characters, so a round decodes and trains on about a third of the positions.
    "tiny-micro-bpe": TinyVariant(
        "bpe", 64, 2, 4, 2, 256, bpe_vocab_size=1024, description="0.16M params, byte-level BPE"
    ),
    "tiny-large": TinyVariant("char", 288, 10, 8, 4, 864, description="10M params, char tokenizer"),
    "tiny-bpe": TinyVariant("bpe", 128, 4, 4, 2, 512, bpe_vocab_size=1024, description="1.1M params, byte-level BPE"),
}


def is_tiny(name: str) -> bool:
    return name in TINY_VARIANTS


def looks_local(source: str) -> bool:
    return source.startswith((".", "/", "~")) or Path(source).expanduser().exists()


def check_model_source(source: str) -> str:
    """`source` as given, or a ValueError that names it and the fix."""
    if is_tiny(source) or source == DEFAULT_MODEL:
        return source
    if looks_local(source):
        if not Path(source).expanduser().is_dir():
            raise ValueError(
                f"model path {source!r} does not exist or is not a directory; give a local HF "
                f"checkpoint directory, a hub id such as Qwen/Qwen2.5-0.5B-Instruct, {DEFAULT_MODEL!r} or 'tiny'"
            )
        return source
    if not HUB_ID.match(source):
        raise ValueError(
            f"model {source!r} is neither a tiny variant ({', '.join(TINY_VARIANTS)}), {DEFAULT_MODEL!r}, "
            "an existing directory nor a hub id such as Qwen/Qwen2.5-0.5B-Instruct"
        )
    return source
