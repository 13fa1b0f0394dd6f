"""bench/roofline.py's decoding measurements: our decoder's and transformers' `generate` time
for B rows and a number of steps (every row runs them all: no EOS), the decoding rate with the
prefill taken out, and one real `sample_completions` round."""

from __future__ import annotations

import torch

from bench.matmul_rate import Clock


class _NoEndOfText:
    """The tokenizer with no EOS id, so that every row decodes all its steps (a fixed batch)."""

    eos_token_id = -1

    def __init__(self, tokenizer):
        self.__dict__["inner"] = tokenizer

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)

    def __call__(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def layout(batch: int, prompts: list[str]) -> tuple[list[str], int]:
    """B rows as a round has them: 4 prompts x B/4 samples (1 prompt x B below 4 rows)."""
    if batch < 4 or batch % 4:
        return prompts[:1], batch
    return prompts[:4], batch // 4


def decode_fixed(policy, prompts: list[str], batch: int, steps: int, dtype: torch.dtype) -> None:
    """Our decoding loop on B rows laid out as a round has them, `steps` tokens each, no EOS."""
    from sapo.training.decoder.decoding import decode_samples

    chosen, samples = layout(batch, prompts)
    decode_samples(
        policy.model,
        _NoEndOfText(policy.tokenizer),
        chosen,
        samples_per_prompt=samples,
        max_new_tokens=steps,
        temperature=1.0,
        seed=0,
        device=policy.device,
        weights_dtype=dtype,
    )


def ours_seconds(policy, prompts: list[str], batch: int, steps: int, dtype: torch.dtype, clock: Clock) -> float:
    started = clock()
    decode_fixed(policy, prompts, batch, steps, dtype)
    return clock() - started


def hf_seconds(model, tokenizer, prompts: list[str], batch: int, steps: int, dtype: torch.dtype, clock: Clock) -> float:
    """transformers' `generate` on `model` (fp32 under autocast to `dtype` on a CPU; on a GPU,
    `model` is already the bf16 copy)."""
    chosen, samples = layout(batch, prompts)
    tokenizer.padding_side = "left"
    enc = tokenizer(
        [p for p in chosen for _ in range(samples)], return_tensors="pt", padding=True, add_special_tokens=False
    ).to(model.device)
    device_type = model.device.type
    cpu_bf16 = device_type == "cpu" and dtype == torch.bfloat16
    autocast = (
        torch.autocast(device_type, dtype=torch.bfloat16) if cpu_bf16 else torch.autocast(device_type, enabled=False)
    )
    torch.manual_seed(0)
    started = clock()
    with torch.inference_mode(), autocast:
        model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=steps,
            min_new_tokens=steps,
            pad_token_id=tokenizer.pad_token_id,
        )
    return clock() - started


def decode_tokens_per_s(measure, batch: int, steps: int) -> float:
    """Decoding alone: (steps - 1) tokens per row over the time a `steps` run takes beyond a 1-step
    run (which is the prefill, the first token and the setup). `measure(batch, steps)` -> seconds."""
    measure(batch, 2)  # warm-up: first-call costs of this shape
    full = measure(batch, steps)
    first = min(measure(batch, 1) for _ in range(2))
    return batch * (steps - 1) / max(full - first, 1e-9)


def real_round(policy, prompts: list[str], max_new_tokens: int, clock: Clock) -> tuple[int, float]:
    from sapo.training.completions.generation import sample_completions

    started = clock()
    _, tokens, _ = sample_completions(policy, prompts[:4], num_generations=8, max_new_tokens=max_new_tokens, seed=1)
    return tokens, clock() - started
