"""Batched, KV-cached decoding of G samples per prompt, with a shared prefill and early stops.

Why not `model.generate`: for G samples per prompt it prefills every prompt G times, keeps every
finished row in the batch until the longest one ends, and checks stop strings by decoding the
whole batch each step. A SAPO round is G=8 samples of short answers behind a long prompt, so all
three dominate. Here each prompt is prefilled once and its cache repeated G times, each row
leaves the batch as soon as it emits EOS or closes its `</answer>`, and stop strings are found
from per-token text. The sampling distribution is the one `generate` uses with temperature T
and no top-k/top-p: softmax(logits / T).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch


class GenerationInterrupted(RuntimeError):
    """Generation was stopped early because the node is shutting down."""


@dataclass(frozen=True)
class DecodedBatch:
    token_ids: list[list[int]]  # per row (prompt-major: prompt i's samples are rows i*G .. i*G+G-1), EOS excluded
    new_tokens: int
    steps: int


class _TokenText:
    """Text of single tokens, decoded once each, for spotting a stop string as it is written."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self.cache.get(token)
        if text is None:
            text = self.cache[token] = self.tokenizer.decode([token], skip_special_tokens=True)
        return text


def decode_samples(
    model,
    tokenizer,
    prompts: list[str],
    *,
    samples_per_prompt: int,
    max_new_tokens: int,
    temperature: float | None,
    seed: int,
    device: torch.device,
    stop_text: str | None = None,
    stop: threading.Event | None = None,
    autocast=contextlib.nullcontext,
) -> DecodedBatch:
    """`samples_per_prompt` continuations of each prompt; temperature None means greedy.
    `autocast` gives the precision context of the forward passes (Policy.autocast)."""
    eos = tokenizer.eos_token_id
    tokenizer.padding_side = "left"
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    input_ids = encoded["input_ids"].to(device)
    attention = encoded["attention_mask"].to(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    token_text = _TokenText(tokenizer)
    tail_keep = len(stop_text) + 8 if stop_text else 0
    rows = len(prompts) * samples_per_prompt
    generated: list[list[int]] = [[] for _ in range(rows)]
    tails = [""] * rows
    was_training = model.training
    model.eval()
    steps = 0
    try:
        with torch.inference_mode(), autocast():
            # Left padding shifts positions; explicit ids make every row's prompt start at 0.
            positions = (attention.cumsum(-1) - 1).clamp_min(0)
            out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1)
            cache = out.cache
            if samples_per_prompt > 1:
                cache.batch_repeat_interleave(samples_per_prompt)
            logits = out.logits[:, -1, :].float().repeat_interleave(samples_per_prompt, dim=0)
            attention = attention.repeat_interleave(samples_per_prompt, dim=0)
            next_position = positions[:, -1:].repeat_interleave(samples_per_prompt, dim=0) + 1
            active = list(range(rows))  # batch row -> output row
            for _ in range(max_new_tokens):
                if stop is not None and stop.is_set():
                    raise GenerationInterrupted("generation stopped for shutdown")
                if temperature is None:
                    chosen = logits.argmax(dim=-1, keepdim=True)
                else:
                    probs = torch.softmax(logits / temperature, dim=-1)
                    chosen = torch.multinomial(probs, 1, generator=generator)
                steps += 1
                keep: list[int] = []
                for position, (row, token) in enumerate(zip(active, chosen.squeeze(-1).tolist())):
                    if token == eos:
                        continue
                    generated[row].append(token)
                    if stop_text:
                        tails[row] = (tails[row] + token_text(token))[-tail_keep:]
                        if stop_text in tails[row]:
                            continue
                    keep.append(position)
                if not keep:
                    break
                if len(keep) < len(active):
                    index = torch.tensor(keep, device=device)
                    cache.batch_select_indices(index)
                    chosen, attention, next_position = chosen[index], attention[index], next_position[index]
                    active = [active[p] for p in keep]
                if len(generated[active[0]]) >= max_new_tokens:
                    break
                attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=-1)
                out = model(
                    input_ids=chosen,
                    attention_mask=attention,
                    position_ids=next_position,
                    cache=cache,
                    use_cache=True,
                )
                cache = out.cache
                logits = out.logits[:, -1, :].float()
                next_position = next_position + 1
    finally:
        if was_training:
            model.train()
    return DecodedBatch(generated, sum(len(g) for g in generated), steps)
