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
import torch.nn.functional as F


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


# --- the static KV cache ----------------------------------------------------------------------------


class StaticKVCache:
    """Keys and values of every layer, allocated once for `length` columns.

    Rows are left-padded prompts followed by their generated tokens, so at every step all rows
    write the same column. Keys are stored transposed ([head_dim, column]): a decoding step's
    scores are then a plain batched matmul over contiguous rows of it. A row that finishes is
    dropped with `keep` (one copy of the cache), so later steps cost only the live rows.
    """

    def __init__(self, layers: int, rows: int, kv_heads: int, head_dim: int, length: int, dtype, device):
        # Never read before written: a step attends to columns 0..its own, all of them filled.
        self.keys_t = torch.empty((layers, rows, kv_heads, head_dim, length), dtype=dtype, device=device)
        self.values = torch.empty((layers, rows, kv_heads, length, head_dim), dtype=dtype, device=device)

    @property
    def rows(self) -> int:
        return self.values.shape[1]

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the current rows), in that order."""
        self.keys_t = self.keys_t.index_select(1, rows)
        self.values = self.values.index_select(1, rows)


# --- the Llama-family decoder -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # q, k and v projections stacked: [(heads + 2 kv_heads) x head_dim, hidden]
    qkv_bias: torch.Tensor | None
    out: torch.Tensor
    out_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # gate and up projections stacked: [2 x intermediate, hidden]
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


_SUPPORTED_TYPES = ("llama", "qwen2")


def _is_plain_linear(module) -> bool:
    """A torch Linear, or a PEFT LoRA layer over one whose adapters are plain LoRA (no DoRA or
    other variant), so that its effect is a weight delta this decoder can fold in."""
    base = getattr(module, "base_layer", None)
    if base is None:
        return isinstance(module, torch.nn.Linear)
    return (
        isinstance(base, torch.nn.Linear)
        and hasattr(module, "get_delta_weight")
        and not getattr(module, "lora_variant", {})
        and not getattr(module, "fan_in_fan_out", False)
    )


def _effective_linear(module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear layer's weight and bias, with its active, unmerged LoRA adapters folded in."""
    base = getattr(module, "base_layer", None)
    if base is None:
        return module.weight, module.bias
    weight, bias = base.weight, base.bias
    if module.disable_adapters:
        return weight, bias
    for name in module.active_adapters:
        if name not in module.lora_A or name in module.merged_adapters:
            continue
        weight = weight + module.get_delta_weight(name)
        if module.lora_bias.get(name, False):
            extra = module.lora_B[name].bias * module.scaling[name]
            bias = extra if bias is None else bias + extra
    return weight, bias


def _stack(parts: list[tuple[torch.Tensor, torch.Tensor | None]], dtype, pack) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weights (and biases) of linear layers that read the same input, as one layer, in `dtype`,
    laid out by `pack` for the matmul that will use them. Each weight is read once: the copy into
    the stacked tensor is also the cast (a single fp32 layer is not copied at all)."""
    if len(parts) == 1:
        weight = parts[0][0].to(dtype).contiguous()
    else:
        weight = torch.empty((sum(w.shape[0] for w, _ in parts), parts[0][0].shape[1]), dtype=dtype,
                             device=parts[0][0].device)
        for rows, (w, _) in zip(weight.split([w.shape[0] for w, _ in parts]), parts):
            rows.copy_(w)
    if all(b is None for _, b in parts):
        return pack(weight), None
    bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in parts])
    return pack(weight), bias.to(dtype)


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise.default(x, weight, bias, "none", [], "")


def _onednn_packer(dtype: torch.dtype, device: torch.device, rows: int):
    """On a CPU with oneDNN: a function that lays a weight out in oneDNN's blocked format for
    `rows`-row matmuls, done once here instead of inside every matmul, as F.linear does. Measured
    on one core at 32 rows: 1.4x the fp32 and 1.3x the bf16 matmul rate of F.linear. None elsewhere."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    try:
        probe = torch.ones((8, 8), dtype=dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(probe, rows)
        if not torch.equal(_onednn_linear(torch.ones((2, 8), dtype=dtype), packed), torch.full((2, 8), 8, dtype=dtype)):
            return None
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    return lambda weight: torch.ops.mkldnn._reorder_linear_weight(weight, rows)


class LlamaDecoder:
    """A Llama-family causal LM's forward pass for decoding, on a `StaticKVCache`.

    Built from the model's current weights (LoRA adapters merged, q/k/v and gate/up stacked,
    cast to `dtype`) at the start of each `decode_samples` call, so it always samples the policy
    as it is now. In bf16 the matmuls and the cache are bf16 while the residual stream, the
    norms, rotary embeddings and softmax stay fp32: the numerics of bf16 autocast. In fp32 it
    computes what the transformers forward computes, op for op, up to the summation order inside
    the matmul kernels (tests/training/test_decoding.py checks greedy tokens against generate).
    """

    def __init__(self, causal_lm, dtype: torch.dtype, rows: int = 32):
        config = causal_lm.config
        body = causal_lm.model
        self.dtype = dtype
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = body.norm.variance_epsilon
        self.rotary = body.rotary_emb
        self.embed = body.embed_tokens
        self.final_norm = body.norm.weight
        device = body.norm.weight.device
        packer = _onednn_packer(dtype, device, rows)
        self.linear = F.linear if packer is None else _onednn_linear
        pack = packer or (lambda weight: weight)
        self.lm_head = pack(_effective_linear(causal_lm.lm_head)[0].to(dtype).contiguous())
        self.intermediate = config.intermediate_size
        self.layers = []
        for block in body.layers:
            attention, mlp = block.self_attn, block.mlp
            qkv = _stack([_effective_linear(getattr(attention, n)) for n in ("q_proj", "k_proj", "v_proj")], dtype, pack)
            out = _stack([_effective_linear(attention.o_proj)], dtype, pack)
            gate_up = _stack([_effective_linear(mlp.gate_proj), _effective_linear(mlp.up_proj)], dtype, pack)
            down = _stack([_effective_linear(mlp.down_proj)], dtype, pack)
            self.layers.append(_Layer(block.input_layernorm.weight, *qkv, *out, block.post_attention_layernorm.weight,
                                      *gate_up, *down))

    @staticmethod
    def unsupported(model) -> str | None:
        """Why `model` must decode through its own forward instead, or None if this decoder fits."""
        causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = getattr(causal_lm, "config", None)
        if getattr(config, "model_type", None) not in _SUPPORTED_TYPES:
            return f"model type {getattr(config, 'model_type', None)!r} is not one of {_SUPPORTED_TYPES}"
        if getattr(config, "hidden_act", None) != "silu":
            return f"activation {config.hidden_act!r} is not silu"
        if getattr(config, "use_sliding_window", False) or "sliding_attention" in (getattr(config, "layer_types", None) or ()):
            return "sliding-window attention"
        body = getattr(causal_lm, "model", None)
        if body is None or not all(hasattr(body, n) for n in ("embed_tokens", "layers", "norm", "rotary_emb")):
            return "not the LlamaModel layout"
        if not hasattr(body.norm, "variance_epsilon"):
            return "its final norm is not an RMSNorm"
        for block in body.layers:
            attention, mlp = block.self_attn, block.mlp
            if not all(hasattr(attention, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
                return "an attention block without q/k/v/o projections"
            if any(hasattr(attention, n) for n in ("q_norm", "k_norm")):
                return "q/k norms"
            linears = [getattr(attention, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
            linears += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
            if any(m is None or not _is_plain_linear(m) for m in linears):
                return "a projection that is not a linear layer or a plain LoRA adapter on one"
        if not _is_plain_linear(causal_lm.lm_head):
            return "an lm_head that is not a linear layer"
        return None

    @classmethod
    def of(cls, model, dtype: torch.dtype, rows: int = 32) -> LlamaDecoder | None:
        """This decoder for `model` (a transformers causal LM or a PEFT wrapper of one), its
        matmuls laid out for about `rows` rows; None if the model does not fit it."""
        if cls.unsupported(model) is not None:
            return None
        return cls(model.get_base_model() if hasattr(model, "get_base_model") else model, dtype, rows)

    def new_cache(self, rows: int, length: int, device) -> StaticKVCache:
        return StaticKVCache(len(self.layers), rows, self.kv_heads, self.head_dim, length, self.dtype, device)

    def rotary_tables(self, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin for positions 0..length-1, from the model's own rotary embedding
        (so its scaling variant applies). With sin's first half negated, rotate_half(x) x sin is
        roll(x, head_dim / 2) x signed sin: the same products, without a concatenation."""
        positions = torch.arange(length, device=device)[None]
        cos, sin = self.rotary(torch.empty(0, device=device, dtype=torch.float32), positions)
        half = self.head_dim // 2
        return cos[0].float(), torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1).float()

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return x * cos + x.roll(self.head_dim // 2, dims=-1) * sin

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps).to(self.dtype)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self._norm(x, self.final_norm), self.lm_head).float()

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor, cache: StaticKVCache,
                tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Run the left-padded prompts `input_ids` [rows, L] into columns 0..L-1 of `cache`, whose
        rows are each prompt's samples (prompt-major: cache.rows / rows copies of each); the
        logits [rows, vocab] after each prompt's last token."""
        rows, length = input_ids.shape
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        cos, sin = (t[positions].unsqueeze(2) for t in tables)  # [rows, L, 1, head_dim]
        causal = torch.ones((length, length), dtype=torch.bool, device=input_ids.device).tril()
        # A padding query may see only itself: it must see something, or its softmax is NaN.
        mask = (causal & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=input_ids.device)
        mask = mask.unsqueeze(1)
        x = self.embed(input_ids).float()
        for index, layer in enumerate(self.layers):
            qkv = self.linear(self._norm(x, layer.input_norm), layer.qkv, layer.qkv_bias)
            qk = self._rotate(qkv[..., : (heads + kv_heads) * head_dim].unflatten(-1, (heads + kv_heads, head_dim)),
                              cos, sin).to(self.dtype)
            q = qk[:, :, :heads].transpose(1, 2)
            k = qk[:, :, heads:].transpose(1, 2)
            v = qkv[..., (heads + kv_heads) * head_dim :].unflatten(-1, (kv_heads, head_dim)).transpose(1, 2)
            copies = (rows, cache.rows // rows)
            cache.keys_t[index].unflatten(0, copies)[..., :length] = k.transpose(-1, -2).unsqueeze(1)
            cache.values[index].unflatten(0, copies)[:, :, :, :length] = v.unsqueeze(1)
            if kv_heads != heads:
                k = k.repeat_interleave(heads // kv_heads, dim=1)
                v = v.repeat_interleave(heads // kv_heads, dim=1)
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + self.linear(attended.transpose(1, 2).flatten(2), layer.out, layer.out_bias)
            gate_up = self.linear(self._norm(x, layer.post_norm), layer.gate_up, layer.gate_up_bias)
            x = x + self.linear(F.silu(gate_up[..., : self.intermediate]) * gate_up[..., self.intermediate :],
                             layer.down, layer.down_bias)
        return self._logits(x[:, -1])

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, column: int, bias: torch.Tensor,
             cache: StaticKVCache, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """One token per row (`tokens` [rows]) written at `column`; the next logits [rows, vocab].

        `bias` [rows x kv_heads, 1, column + 1] is 0 where a row may attend and -inf on its padding.
        The query heads that share a key/value head are that head's rows of one small matmul, so
        grouped-query attention needs no copies of the cache.
        """
        rows = tokens.shape[0]
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        group = heads // kv_heads
        qk_width = (heads + kv_heads) * head_dim
        scale = head_dim**-0.5
        cos, sin = (t[positions].unsqueeze(1) for t in tables)  # [rows, 1, head_dim]
        x = self.embed(tokens).float()
        for index, layer in enumerate(self.layers):
            qkv = self.linear(self._norm(x, layer.input_norm), layer.qkv, layer.qkv_bias)
            qk = self._rotate(qkv[:, :qk_width].view(rows, heads + kv_heads, head_dim), cos, sin)
            keys_t, values = cache.keys_t[index], cache.values[index]
            keys_t[:, :, :, column] = qk[:, heads:]
            values[:, :, column] = qkv[:, qk_width:].view(rows, kv_heads, head_dim)
            q = qk[:, :heads].to(self.dtype).reshape(rows * kv_heads, group, head_dim)
            scores = torch.baddbmm(bias, q, keys_t[..., : column + 1].flatten(0, 1), alpha=scale)
            weights = scores.softmax(dim=-1, dtype=torch.float32).to(self.dtype)
            attended = torch.bmm(weights, values[:, :, : column + 1].flatten(0, 1))
            x = x + self.linear(attended.view(rows, heads * head_dim), layer.out, layer.out_bias)
            gate_up = self.linear(self._norm(x, layer.post_norm), layer.gate_up, layer.gate_up_bias)
            x = x + self.linear(F.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :],
                             layer.down, layer.down_bias)
        return self._logits(x)


# --- decoding ------------------------------------------------------------------------------------------


class _StaticDecoding:
    """A batch decoding on `LlamaDecoder` and its static cache."""

    def __init__(self, decoder: LlamaDecoder, input_ids, attention, samples_per_prompt: int, max_new_tokens: int):
        self.decoder = decoder
        device = input_ids.device
        prompts, length = input_ids.shape
        self.column = length
        self.tables = decoder.rotary_tables(length + max_new_tokens, device)
        # Left padding shifts positions; explicit ids make every row's prompt start at 0.
        positions = (attention.cumsum(-1) - 1).clamp_min(0)
        self.cache = decoder.new_cache(prompts * samples_per_prompt, length + max_new_tokens, device)
        self.first_logits = decoder.prefill(input_ids, attention.bool(), positions, self.cache, self.tables)
        repeat = torch.arange(prompts, device=device).repeat_interleave(samples_per_prompt)
        self.first_logits = self.first_logits[repeat]
        self.next_position = positions[:, -1][repeat] + 1
        # 0 where a row may attend, -inf on its left padding; generated columns are all 0.
        self.bias = torch.zeros((prompts * samples_per_prompt, length + max_new_tokens), dtype=decoder.dtype,
                                device=device)
        self.bias[:, :length].masked_fill_(attention[repeat] == 0, float("-inf"))

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.keep(rows)
        self.next_position, self.bias = self.next_position[rows], self.bias[rows]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        kv_heads = self.decoder.kv_heads
        bias = self.bias[:, None, : self.column + 1].repeat_interleave(kv_heads, dim=0)
        logits = self.decoder.step(tokens, self.next_position, self.column, bias, self.cache, self.tables)
        self.column += 1
        self.next_position = self.next_position + 1
        return logits


class _ModelDecoding:
    """A batch decoding through the model's own forward and its dynamic cache (any causal LM)."""

    def __init__(self, model, input_ids, attention, samples_per_prompt: int, autocast):
        self.model, self.autocast = model, autocast
        positions = (attention.cumsum(-1) - 1).clamp_min(0)
        with autocast():
            out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                        logits_to_keep=1)
        self.cache = out.cache
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
            out = self.model(input_ids=tokens[:, None], attention_mask=self.attention, position_ids=self.next_position,
                             cache=self.cache, use_cache=True)
        self.cache = out.cache
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
) -> DecodedBatch:
    """`samples_per_prompt` continuations of each prompt; temperature None means greedy.

    `weights_dtype` is the precision `LlamaDecoder` runs in (None: the model's own); `autocast`
    gives the precision context of a model that decodes through its own forward (Policy.autocast).
    """
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
        with torch.inference_mode():
            decoder = LlamaDecoder.of(model, weights_dtype or next(model.parameters()).dtype, rows)
            if decoder is not None:
                decoding = _StaticDecoding(decoder, input_ids, attention, samples_per_prompt, max_new_tokens)
            else:
                decoding = _ModelDecoding(model, input_ids, attention, samples_per_prompt, autocast)
            logits = decoding.first_logits
            active = list(range(rows))  # batch row -> output row
            for _ in range(max_new_tokens):
                if stop is not None and stop.is_set():
                    raise GenerationInterrupted("generation stopped for shutdown")
                chosen = sample_tokens(logits, temperature, generator)
                steps += 1
                keep: list[int] = []
                for position, (row, token) in enumerate(zip(active, chosen.tolist())):
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
                    decoding.keep(index)
                    chosen = chosen[index]
                    active = [active[p] for p in keep]
                if len(generated[active[0]]) >= max_new_tokens:
                    break
                logits = decoding.step(chosen)
    finally:
        if was_training:
            model.train()
    return DecodedBatch(generated, sum(len(g) for g in generated), steps)
