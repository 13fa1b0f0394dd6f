"""Settings owned by the training layer. Every field documents itself for --help and README."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sapo.training.models.sources import check_model_source


class ModelSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        default="smollm2-135m",
        description="policy to train: 'smollm2-135m' (built-in, offline), a tiny variant "
        "('tiny', 'tiny-bpe', 'tiny-micro', 'tiny-small', 'tiny-large'), a local HF directory or a hub id "
        "such as Qwen/Qwen2.5-0.5B-Instruct",
        min_length=1,
    )
    device: str = Field(default="auto", description="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    lora: bool = Field(default=False, description="train a LoRA adapter instead of the full model")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="the update's precision: auto = bf16 on CUDA GPUs that support it and, for Llama-family models, "
        "on CPUs with AVX512-BF16 or AMX (the base's matmuls; LoRA, logits and log-softmax stay fp32), else fp32; "
        "weights and optimizer state stay fp32",
    )
    generation_precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="precision of the weights sampling runs on: auto = bf16 where the device multiplies bf16 in "
        "hardware (CPUs with AVX512-BF16 or AMX, bf16-capable CUDA GPUs), else fp32; the update keeps --precision",
    )
    lora_rank: int = Field(default=16, ge=1, le=512, description="LoRA rank r (alpha = 2r)")
    prompt_style: Literal["auto", "chat", "plain"] = Field(
        default="auto",
        description="chat template with system prompt, or the bare question (auto: plain for tiny models)",
    )
    one_shot: bool = Field(default=True, description="put one worked example in the system prompt (SmolLM2 needs it)")
    torch_threads: int = Field(
        default=0, ge=0, le=256, description="torch CPU threads (0 = one per core this process may use)"
    )
    models_dir: Path | None = Field(
        default=None, description="where converted models and warm starts are cached (default: DATA_DIR/models)"
    )
    warm_start_steps: int | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description="supervised steps on correct solutions before the first round, cached (default: 200 for tiny "
        "models, which know nothing yet; 0 for pretrained ones)",
    )
    warm_start_share: str | None = Field(
        default=None,
        pattern=r"^\d+/[1-9]\d*$",
        description="K/N: warm-start only on the questions in share K of N (by a hash of the question), a "
        "specialist whose knowledge is disjoint from the other shares' (default: all questions)",
    )
    warm_start_answer_noise: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="fraction of warm-start targets whose answer is a near miss (a model unsure of what it mostly "
        "knows: its likeliest answer right, its samples often wrong, as RL finds a pretrained model)",
    )
    warm_start_tag_rate: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="fraction of warm-start targets inside <answer> tags; below 1 leaves the format to be discovered",
    )

    @field_validator("model")
    @classmethod
    def _known_source(cls, model: str) -> str:
        return check_model_source(model)

    @field_validator("device")
    @classmethod
    def _device_name(cls, device: str) -> str:
        # whether this machine has it is checked when the node starts (that needs torch)
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", device.strip().lower()):
            raise ValueError(f"unknown device {device!r}; choose auto, cpu, cuda, cuda:N or mps")
        return device

    @model_validator(mode="after")
    def _warm_start_is_full_fine_tuning(self) -> ModelSettings:
        if self.lora and self.warm_start_steps:
            raise ValueError("--warm-start-steps trains the full model; it cannot be combined with --lora")
        return self


class TrainingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reward: Literal["binary", "partial"] = Field(
        default="binary",
        description="binary: 1 if the verifier accepts the answer, else 0 (the paper's); partial: the task's own "
        "partial credit for a well-formed answer (a weekday in the wrong case, a trivial logical conclusion); an "
        "answer with text after its value, or that merely contains the key, scores 0 under both",
    )
    generations: int = Field(default=8, ge=2, le=64, description="G: completions sampled per question")
    max_new_tokens: int = Field(default=256, ge=1, le=8192, description="generation length cap per completion")
    temperature: float = Field(default=1.0, gt=0, le=5.0, description="sampling temperature")
    lr: float | None = Field(
        default=None,
        gt=0,
        lt=1.0,
        description="learning rate (default: 1e-4 for tiny models, 2e-4 with LoRA, 1e-6 for full fine-tuning)",
    )
    optimizer: Literal["adam", "adamw"] = Field(default="adam", description="optimizer")
    weight_decay: float = Field(default=0.0, ge=0, lt=1.0, description="weight decay (adamw)")
    max_grad_norm: float = Field(default=1.0, gt=0, description="gradient clipping norm")
    updates_per_batch: int = Field(
        default=2, ge=1, le=32, description="passes over each round's batch; >1 makes the PPO clip active"
    )
    minibatches: int = Field(default=2, ge=1, le=64, description="optimizer steps per pass")
    micro_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="sequences per forward/backward pass (default: as many as fit about 2 GiB of activations); "
        "gradients accumulate, so this changes peak memory, not the update",
    )
    eps_low: float = Field(default=0.2, ge=0, lt=1, description="lower clip range of the ratio")
    eps_high: float = Field(default=0.28, ge=0, lt=10, description="upper clip range of the ratio")


def default_learning_rate(model: str, lora: bool) -> float:
    """Rates that learn without collapsing, measured on this project's CPU-scale runs."""
    from sapo.training.models.sources import is_tiny

    if is_tiny(model):
        return 1e-4
    return 2e-4 if lora else 1e-6
