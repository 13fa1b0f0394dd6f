"""Batched, KV-cached decoding of G samples per prompt, with a shared prefill and early stops.

Why not `model.generate`: for G samples per prompt it prefills every prompt G times, keeps every
finished row in the batch until the longest one ends, and checks stop strings by decoding the
whole batch each step. A SAPO round is G=8 samples of short answers behind a long prompt, so all
three dominate. Here each prompt is prefilled once and its cache repeated G times, each row
leaves the batch as soon as it emits EOS or closes its `</answer>`, and stop strings are found
from per-token text.

Why not the model's own forward for each token (`LlamaDecoder` instead): at a decode batch of 32
on one CPU core, a transformers forward spent a quarter of its time growing its cache with
`torch.cat` and another sixth in sampling, and its hundreds of small Python-level modules per
token hold the GIL. `LlamaDecoder` runs Llama-family models (Llama, SmolLM2, Qwen2, the tiny
test models; LoRA merged in) on a static cache with stacked q/k/v and gate/up weights, laid out
once per call for oneDNN's matmul on a CPU, optionally in bf16; any other model runs through its
own forward. That copy of the weights costs memory while a call runs: 270 MB for SmolLM2 in bf16,
540 MB in fp32.

The sampling distribution is the one `generate` uses with temperature T and no top-k/top-p,
softmax(logits / T), drawn by inverse CDF: one uniform per row instead of torch.multinomial's
one exponential per vocabulary entry (49k of them per row, the slowest op of a step).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch

from sapo.training.decoder.hf_cache import CACHE
from sapo.training.decoder.llama_decoder import LlamaDecoder


class GenerationInterrupted(RuntimeError):
    """Generation was stopped early because the node is shutting down."""


@dataclass(frozen=True)
class DecodedBatch:
    token_ids: list[list[int]]  # per row (prompt-major: prompt i's samples are rows i*G .. i*G+G-1), EOS excluded
    new_tokens: int
    steps: int
    # with record_logprobs: per row, log p of each sampled token under softmax(logits / T)
    token_logprobs: list[list[float]] | None = None


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


def sample_tokens(logits: torch.Tensor, temperature: float | None, generator: torch.Generator) -> torch.Tensor:
    """One token per row of `logits` [rows, vocab]: argmax when `temperature` is None, else a
    draw from softmax(logits / temperature).

    The draw inverts the CDF with one uniform per row: exp((logits - max) / T), a float64 running
    sum (so a token's share is exact to about 1e-16 of the total, however long the vocabulary;
    float32 on MPS, which has no float64), and a binary search for u x total. Same distribution
    as softmax + multinomial, a tenth of the time on a CPU: multinomial draws one exponential
    variate per vocabulary entry.
    """
    if temperature is None:
        return logits.argmax(dim=-1)
    wide = torch.float32 if logits.device.type == "mps" else torch.float64
    weights = (logits.float() - logits.amax(dim=-1, keepdim=True)).mul_(1.0 / temperature).exp_()
    cumulative = weights.to(wide).cumsum_(dim=-1)
    target = torch.rand((logits.shape[0], 1), generator=generator, dtype=wide, device=logits.device)
    # The first token whose running sum exceeds u x total; a zero-probability token never does.
    chosen = torch.searchsorted(cumulative, target.mul_(cumulative[:, -1:]), right=True)
    return chosen.clamp_max_(logits.shape[-1] - 1).squeeze(-1)


# --- decoding ------------------------------------------------------------------------------------------


def segments_of(owners: list[int]) -> list[tuple[int, int, int]]:
    """(owner, start, end) of each run of equal values in `owners` (rows of a mixed batch)."""
    runs: list[tuple[int, int, int]] = []
    for position, owner in enumerate(owners):
        if runs and runs[-1][0] == owner:
            runs[-1] = (owner, runs[-1][1], position + 1)
        else:
            runs.append((owner, position, position + 1))
    return runs


class _StaticDecoding:
    """A batch decoding on `LlamaDecoder` and its shared-prompt cache. With `prompt_owners`
    (a mixed batch), prompt i and its samples decode with adapter prompt_owners[i]."""

    def __init__(
        self,
        decoder: LlamaDecoder,
        input_ids,
        attention,
        samples_per_prompt: int,
        max_new_tokens: int,
        prompt_owners: list[int] | None = None,
    ):
        self.decoder = decoder
        device = input_ids.device
        prompts, length = input_ids.shape
        self.tables = decoder.rotary_tables(length + max_new_tokens, device)
        # Left padding shifts positions; explicit ids make every row's prompt start at 0.
        positions = (attention.cumsum(-1) - 1).clamp_min(0)
        self.cache = decoder.new_cache(prompts, samples_per_prompt, length, max_new_tokens, device)
        self.owners = None if prompt_owners is None else [o for o in prompt_owners for _ in range(samples_per_prompt)]
        prompt_segments = None if prompt_owners is None else segments_of(prompt_owners)
        first = decoder.prefill(input_ids, attention.bool(), positions, self.cache, self.tables, prompt_segments)
        self.first_logits = first.repeat_interleave(samples_per_prompt, dim=0)
        self.next_position = positions[:, -1].repeat_interleave(samples_per_prompt) + 1

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.keep(rows)
        self.next_position = self.next_position[rows]
        if self.owners is not None:
            self.owners = [self.owners[r] for r in rows.tolist()]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        segments = None if self.owners is None else segments_of(self.owners)
        logits = self.decoder.step(tokens, self.next_position, self.cache, self.tables, segments)
        self.next_position = self.next_position + 1
        return logits


class _ModelDecoding:
    """A batch decoding through the model's own forward and its dynamic cache (any causal LM)."""

    def __init__(self, model, input_ids, attention, samples_per_prompt: int, autocast):
        self.model, self.autocast = model, autocast
        positions = (attention.cumsum(-1) - 1).clamp_min(0)
        with autocast():
            out = model(
                input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
            )
        self.cache = getattr(out, CACHE)
        if samples_per_prompt > 1:
            self.cache.batch_repeat_interleave(samples_per_prompt)
        self.first_logits = out.logits[:, -1, :].float().repeat_interleave(samples_per_prompt, dim=0)
        self.attention = attention.repeat_interleave(samples_per_prompt, dim=0)
        self.next_position = positions[:, -1:].repeat_interleave(samples_per_prompt, dim=0) + 1

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attention, self.next_position = self.attention[rows], self.next_position[rows]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.attention = torch.cat([self.attention, self.attention.new_ones((self.attention.shape[0], 1))], dim=-1)
        with self.autocast():
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=self.attention,
                position_ids=self.next_position,
                use_cache=True,
                **{CACHE: self.cache},
            )
        self.cache = getattr(out, CACHE)
        self.next_position = self.next_position + 1
        return out.logits[:, -1, :].float()


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
    weights_dtype: torch.dtype | None = None,
    record_logprobs: bool = False,
) -> DecodedBatch:
    """`samples_per_prompt` continuations of each prompt; temperature None means greedy.

    `weights_dtype` is the precision `LlamaDecoder` runs in (None: the model's own); `autocast`
    gives the precision context of a model that decodes through its own forward (Policy.autocast).
    """
    batches = _decode(
        model,
        tokenizer,
        prompts,
        samples_per_prompt=samples_per_prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seeds=[seed],
        device=device,
        stop_text=stop_text,
        stop=stop,
        autocast=autocast,
        weights_dtype=weights_dtype,
        record_logprobs=record_logprobs,
    )
    assert batches is not None  # only a mixed batch (adapters) gives None, when LlamaDecoder cannot run it
    return batches[0]


def decode_mixed(
    model,
    tokenizer,
    prompts: list[list[str]],
    adapters: list[str],
    *,
    samples_per_prompt: int,
    max_new_tokens: int,
    temperature: float | None,
    seeds: list[int],
    device: torch.device,
    stop_text: str | None = None,
    stop: threading.Event | None = None,
    weights_dtype: torch.dtype | None = None,
    record_logprobs: bool = False,
) -> list[DecodedBatch] | None:
    """Several LoRA adapters of one PEFT `model` decoding at once: prompts[i] with adapters[i]
    and its own random stream (seeds[i]), in one batch through the base weights; one
    DecodedBatch per adapter, as `decode_samples` would give it alone (up to the kernels'
    summation order). None if the model does not fit `LlamaDecoder` (decode each alone then)."""
    if not (len(prompts) == len(adapters) == len(seeds)):
        raise ValueError("one prompt list and one seed per adapter")
    return _decode(
        model,
        tokenizer,
        prompts,
        adapters=adapters,
        samples_per_prompt=samples_per_prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seeds=seeds,
        device=device,
        stop_text=stop_text,
        stop=stop,
        autocast=contextlib.nullcontext,
        weights_dtype=weights_dtype,
        record_logprobs=record_logprobs,
    )


def _decode(
    model,
    tokenizer,
    prompts,
    *,
    samples_per_prompt,
    max_new_tokens,
    temperature,
    seeds,
    device,
    stop_text,
    stop,
    autocast,
    weights_dtype,
    record_logprobs,
    adapters: list[str] | None = None,
) -> list[DecodedBatch] | None:
    """decode_samples for one prompt list (`prompts` a list of str), or decode_mixed's batch
    (`prompts` one list per adapter): one DecodedBatch per prompt list."""
    lists = prompts if adapters is not None else [prompts]
    flat = [p for prompt_list in lists for p in prompt_list]
    prompt_owners = [owner for owner, prompt_list in enumerate(lists) for _ in prompt_list]
    tokenizer.padding_side = "left"
    encoded = tokenizer(flat, return_tensors="pt", padding=True, add_special_tokens=False)
    input_ids = encoded["input_ids"].to(device)
    attention = encoded["attention_mask"].to(device)
    generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
    row_owner = [owner for owner in prompt_owners for _ in range(samples_per_prompt)]
    rows = _Rows.empty(len(row_owner), bool(record_logprobs and temperature), stop_text, _TokenText(tokenizer))
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            decoder = LlamaDecoder.of(model, weights_dtype or next(model.parameters()).dtype, len(row_owner), adapters)
            decoding: _StaticDecoding | _ModelDecoding
            if decoder is not None:
                owners = prompt_owners if adapters is not None else None
                decoding = _StaticDecoding(decoder, input_ids, attention, samples_per_prompt, max_new_tokens, owners)
            elif adapters is not None:
                return None
            else:
                decoding = _ModelDecoding(model, input_ids, attention, samples_per_prompt, autocast)
            steps = _sample(
                decoding, rows, row_owner, generators, temperature, max_new_tokens, tokenizer.eos_token_id, stop
            )
    finally:
        if was_training:
            model.train()
    return rows.batches(len(lists), row_owner, steps)


def _sample(
    decoding: _StaticDecoding | _ModelDecoding,
    rows: _Rows,
    row_owner: list[int],
    generators: list[torch.Generator],
    temperature: float | None,
    max_new_tokens: int,
    eos: int,
    stop: threading.Event | None,
) -> int:
    """Draw a token for every live row, step after step, until every row has stopped or written
    `max_new_tokens`; the steps taken. A row that stops leaves the batch (and the cache) at once."""
    logits = decoding.first_logits
    active = list(range(len(row_owner)))  # batch row -> output row
    # each owner's rows draw from its own stream, as they would decoding alone; the runs of
    # owners change only when rows leave the batch (one run when a single policy decodes)
    segments = segments_of(row_owner)
    steps = 0
    for _ in range(max_new_tokens):
        if stop is not None and stop.is_set():
            raise GenerationInterrupted("generation stopped for shutdown")
        parts = [sample_tokens(logits[start:end], temperature, generators[owner]) for owner, start, end in segments]
        chosen = parts[0] if len(parts) == 1 else torch.cat(parts)
        steps += 1
        # what a peer's importance weight compares with (training/learning/update.py)
        picked = None if rows.logprobs is None else _logprobs_of(logits, chosen, temperature)
        keep = rows.write(active, chosen.tolist(), picked, eos)
        if not keep:
            break
        if len(keep) < len(active):
            index = torch.tensor(keep, device=chosen.device)
            decoding.keep(index)
            chosen = chosen[index]
            active = [active[p] for p in keep]
            segments = segments_of([row_owner[r] for r in active])
        if len(rows.generated[active[0]]) >= max_new_tokens:
            break
        logits = decoding.step(chosen)
    return steps


def _logprobs_of(logits: torch.Tensor, chosen: torch.Tensor, temperature: float | None) -> list[float]:
    """log p of each row's `chosen` token under softmax(logits / temperature)."""
    assert temperature  # a greedy decoding records no log-probs
    scaled = logits.float() / temperature
    return (scaled.gather(-1, chosen.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)).tolist()


@dataclass
class _Rows:
    """Each output row's tokens so far (and their log-probs), and the text it ended on, to spot
    the stop string as it is written."""

    generated: list[list[int]]
    logprobs: list[list[float]] | None
    tails: list[str]
    stop_text: str | None
    token_text: _TokenText

    @classmethod
    def empty(cls, rows: int, record_logprobs: bool, stop_text: str | None, token_text: _TokenText) -> _Rows:
        logprobs: list[list[float]] | None = [[] for _ in range(rows)] if record_logprobs else None
        return cls([[] for _ in range(rows)], logprobs, [""] * rows, stop_text, token_text)

    def write(self, active: list[int], tokens: list[int], picked: list[float] | None, eos: int) -> list[int]:
        """Append each live row's token (row active[i] drew tokens[i]); the positions in `active`
        of the rows that go on. EOS is not written; the token that completes the stop string is."""
        keep: list[int] = []
        tail_keep = len(self.stop_text) + 8 if self.stop_text else 0
        for position, (row, token) in enumerate(zip(active, tokens)):
            if token == eos:
                continue
            self.generated[row].append(token)
            if self.logprobs is not None and picked is not None:
                self.logprobs[row].append(picked[position])
            if self.stop_text:
                self.tails[row] = (self.tails[row] + self.token_text(token))[-tail_keep:]
                if self.stop_text in self.tails[row]:
                    continue
            keep.append(position)
        return keep

    def batches(self, owners: int, row_owner: list[int], steps: int) -> list[DecodedBatch]:
        """One DecodedBatch per prompt list (owner), its rows in order."""
        batches = []
        for owner in range(owners):
            mine = [r for r, o in enumerate(row_owner) if o == owner]
            tokens = [self.generated[r] for r in mine]
            logprobs = None if self.logprobs is None else [self.logprobs[r] for r in mine]
            batches.append(DecodedBatch(tokens, sum(len(t) for t in tokens), steps, logprobs))
        return batches
