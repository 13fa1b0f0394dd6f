"""A node's own policy: the model, its tokenizer, the device it lives on, and how it is prompted."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from sapo.training.decoder.packed_forward import fits
from sapo.training.models.devices import resolve_device
from sapo.training.models.errors import ModelSourceError
from sapo.training.models.sources import check_model_source, is_tiny, looks_local
from sapo.training.problems.prompts import PromptStyle, prompt_style_for, render_prompt
from sapo.training.problems.tasks import Problem

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("sapo.policy")


@dataclass
class Policy:
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    model_id: str
    prompt_style: PromptStyle
    one_shot: bool
    lora: bool
    bf16: bool = False  # bf16 autocast for forward passes; weights and Adam state stay fp32
    generation_bf16: bool = False  # sampling runs on a bf16 copy of the weights (training/decoder/decoding.py)

    @functools.cached_property
    def tokenizer_fingerprint(self) -> str:
        """Equal for tokenizers that map text to the same ids: when a peer's token log-probs are ours to compare."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        text = backend.to_str() if backend is not None else repr(sorted(self.tokenizer.get_vocab().items()))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def prompt(self, problem: Problem) -> str:
        return render_prompt(problem, self.tokenizer, self.prompt_style, self.one_shot)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def autocast(self):
        """The precision forward passes run in: bf16 autocast where chosen, else plain fp32."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    @property
    def generation_dtype(self) -> torch.dtype:
        """The precision of the weights sampling and greedy decoding run on."""
        return torch.bfloat16 if self.generation_bf16 else torch.float32


def use_bf16(precision: str, device: torch.device, packed: bool = False) -> bool:
    """`auto`: bf16 on CUDA GPUs that support it, and on CPUs with native bf16 matmuls
    (has_native_bf16) when the update runs on the packed forward (`packed`,
    training/decoder/packed_forward.py), where only the frozen base's matmuls round to bf16 while
    attention, LoRA, logits and the log-softmax stay fp32. Measured on an AVX512-BF16 core: the
    default update 1.4x faster, learning within the equivalence bench's tolerance
    (docs/bench/equivalence.md). fp32 on other CPUs (bf16 emulated: 2-13x slower, measured), for
    a model that updates through its own forward on a CPU (autocast recasts every weight every
    call), and on MPS (its bf16 autocast is not reliable across macOS versions)."""
    if precision == "fp32":
        return False
    if precision == "bf16":
        return True
    if precision != "auto":
        raise ValueError(f"precision must be auto, fp32 or bf16, not {precision!r}")
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and packed and has_native_bf16(device)


def has_native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 matrices in hardware: a CUDA GPU that supports bf16, or a
    CPU with AVX512-BF16 or AMX (measured on an AVX512-BF16 EPYC core at a decode batch of 32:
    bf16 matmuls about 1.9x fp32). Without them a CPU emulates bf16, slower than fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        cpu = torch.cpu
        return any(
            getattr(cpu, probe, lambda: False)() for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        )
    return False


def use_bf16_generation(precision: str, device: torch.device) -> bool:
    """`auto`: bf16 where the device has native bf16 matmuls (has_native_bf16), else fp32."""
    if precision == "fp32":
        return False
    if precision == "bf16":
        return True
    if precision != "auto":
        raise ValueError(f"generation precision must be auto, fp32 or bf16, not {precision!r}")
    return has_native_bf16(device)


@dataclass(frozen=True)
class LoraOptions:
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0


def load_policy(
    source: str,
    *,
    device: str = "auto",
    lora: LoraOptions | None = None,
    seed: int = 0,
    models_dir: Path,
    prompt_style: str = "auto",
    one_shot: bool = True,
    weights_from: Path | None = None,
    adapter_from: Path | None = None,
    precision: str = "auto",
    generation_precision: str = "auto",
) -> Policy:
    """Build or load the policy named by `source`.

    `source` is a tiny variant (`tiny`, `tiny-bpe`, ...), `smollm2-135m` (offline default), a
    local HF directory or a hub id. `weights_from` is an HF model directory (a checkpoint or a
    warm start) whose weights replace the source's; `adapter_from` a saved LoRA adapter.
    `precision` is that of the update's forward passes (use_bf16), `generation_precision` that
    of the weights sampling runs on (use_bf16_generation).
    """
    torch_device = resolve_device(device)
    # The seed makes this model's initialisation (a tiny model's weights, a LoRA adapter's)
    # reproducible without reseeding the process's own random stream, which other nodes of a
    # study, and the caller, draw from too.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, tokenizer = _load_base(source, seed=seed, models_dir=models_dir, weights_from=weights_from)
        style = prompt_style_for(prompt_style, is_tiny(source))
        if style == "chat" and not getattr(tokenizer, "chat_template", None):
            raise ModelSourceError(f"model {source!r} has no chat template; use --prompt-style plain")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if lora is not None:
            model = _wrap_lora(model, lora, adapter_from)
    model.to(torch_device)
    return Policy(
        model,
        tokenizer,
        torch_device,
        source,
        style,
        one_shot,
        lora is not None,
        use_bf16(precision, torch_device, packed=fits(model)),
        use_bf16_generation(generation_precision, torch_device),
    )


def _load_base(source: str, *, seed: int, models_dir: Path, weights_from: Path | None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sapo.training.models.smollm2 import load_smollm2
    from sapo.training.models.tiny import build_tiny

    if weights_from is not None:
        return (
            AutoModelForCausalLM.from_pretrained(weights_from, dtype=torch.float32),
            AutoTokenizer.from_pretrained(weights_from),
        )
    if is_tiny(source):
        return build_tiny(source, seed)
    if source == "smollm2-135m":
        return load_smollm2(models_dir / "smollm2-135m")
    try:
        check_model_source(source)
    except ValueError as error:
        raise ModelSourceError(str(error)) from None
    path = str(Path(source).expanduser()) if looks_local(source) else source
    try:
        return (
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
            AutoTokenizer.from_pretrained(path),
        )
    except OSError as exc:
        raise ModelSourceError(
            f"could not load model {source!r}: {exc}. Hub ids need network access "
            "(or a filled HF cache); offline, use 'smollm2-135m', 'tiny' or a local directory."
        ) from exc


def _wrap_lora(model, options: LoraOptions, resume_from: Path | None):
    from peft import LoraConfig, PeftModel, get_peft_model

    if resume_from is not None:
        return PeftModel.from_pretrained(model, resume_from, is_trainable=True)
    config = LoraConfig(
        r=options.rank,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)
