"""`LlamaDecoder`: one decoding step of a Llama-family model (Llama, SmolLM2, Qwen2, the tiny
test models; LoRA merged in) on a static, preallocated KV cache shared by each prompt's G
samples, with stacked q|k|v and gate|up weights laid out once per call for oneDNN's matmul on a
CPU, optionally in bf16. Why it exists, and what runs any other model: decoding.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# --- the static KV cache ----------------------------------------------------------------------------


class SharedPromptCache:
    """Keys and values of every layer: each prompt's once, then each row's own generated tokens.

    A prompt's G samples attend to the same prompt keys, so those are kept once per prompt, and a
    step multiplies them by the queries of all G rows at once (one [G x group, head_dim] x
    [head_dim, L] matmul per prompt and key/value head) instead of reading a copy per row (at
    G = 8, 300 prompt tokens and bf16: 21 ms of attention a step instead of 37).

    Each row's own part holds one column per generated token. A step attends to all of its
    columns, the unwritten ones masked, because a matmul over a column slice of it would first
    copy the slice; so the part starts 16 columns wide and doubles when full (one copy each time,
    log2(max_new_tokens / 16) times at most), never more than twice what is written. A row that
    finishes is dropped with `keep` (one copy of the own part), so later steps cost only the live
    rows. Keys are stored transposed ([head_dim, column]), so scores are plain batched matmuls.
    """

    def __init__(
        self,
        layers: int,
        prompts: int,
        samples: int,
        kv_heads: int,
        head_dim: int,
        prompt_length: int,
        new_tokens: int,
        dtype,
        device,
    ):
        self.prompts, self.samples, self.prompt_length, self.new_tokens = prompts, samples, prompt_length, new_tokens
        self.prompt_keys_t = torch.empty(
            (layers, prompts, kv_heads, head_dim, prompt_length), dtype=dtype, device=device
        )
        self.prompt_values = torch.empty(
            (layers, prompts, kv_heads, prompt_length, head_dim), dtype=dtype, device=device
        )
        self.prompt_bias: torch.Tensor | None = None  # [prompts x kv_heads, 1, L]: 0, or -inf on padding
        width = min(new_tokens, 16)
        # Zeros, not garbage: a masked column still meets a 0 weight in the values' matmul.
        self.keys_t = torch.zeros((layers, prompts * samples, kv_heads, head_dim, width), dtype=dtype, device=device)
        self.values = torch.zeros((layers, prompts * samples, kv_heads, width, head_dim), dtype=dtype, device=device)
        self.own_bias = torch.full((width,), float("-inf"), dtype=dtype, device=device)  # 0 where written
        self.column = 0  # own columns written
        self.slots = torch.arange(prompts * samples, device=device)  # each live row's place among prompts x samples
        self.live: tuple[torch.Tensor, torch.Tensor] | None = None  # (prompt, sample) of each row once some left

    @property
    def rows(self) -> int:
        return self.values.shape[1]

    def open_column(self) -> int:
        """The own column this step writes (the part doubles first if it is full)."""
        width = self.own_bias.shape[0]
        if self.column == width:
            wider = min(2 * width, self.new_tokens)
            self.keys_t = torch.cat([self.keys_t, self.keys_t.new_zeros((*self.keys_t.shape[:-1], wider - width))], -1)
            self.values = torch.cat(
                [self.values, self.values.new_zeros((*self.values.shape[:3], wider - width, self.values.shape[-1]))], 3
            )
            self.own_bias = torch.cat([self.own_bias, self.own_bias.new_full((wider - width,), float("-inf"))])
        self.own_bias[self.column] = 0
        return self.column

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (indices into the current rows), in that order."""
        self.keys_t = self.keys_t.index_select(1, rows)
        self.values = self.values.index_select(1, rows)
        self.slots = self.slots[rows]
        self.live = (self.slots // self.samples, self.slots % self.samples)


# --- the Llama-family decoder -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Adapters:
    """A stacked layer's LoRA factors for each of several adapters (decoding a mixed batch):
    adapter i adds up[i] @ (down[i] @ x), where down[i] stacks the parts' A matrices
    ([parts x r, in]) and up[i] holds their scaled B matrices on its block diagonal."""

    down: list[torch.Tensor]
    up: list[torch.Tensor]


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
    # decoding a mixed batch: each adapter's factors, kept apart from the base weights
    qkv_lora: _Adapters | None = None
    out_lora: _Adapters | None = None
    gate_up_lora: _Adapters | None = None
    down_lora: _Adapters | None = None


# Rows of a mixed batch, in order, by adapter: (adapter index, first row, end row).
Segments = list[tuple[int, int, int]]


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


def _linear_parts(
    module, only_base: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None, list[tuple[torch.Tensor, torch.Tensor, float]]]:
    """A linear layer's weight and bias, and its active, unmerged LoRA adapters as (B, A, scale):
    its effective weight is weight + sum of scale x B @ A. `only_base`: the base layer alone."""
    base = getattr(module, "base_layer", None)
    if base is None:
        return module.weight, module.bias, []
    bias = base.bias
    adapters: list[tuple[torch.Tensor, torch.Tensor, float]] = []
    if module.disable_adapters or only_base:
        if only_base and module.merged_adapters:
            raise ValueError("a mixed batch needs the adapters unmerged")
        return base.weight, bias, adapters
    for name in module.active_adapters:
        if name not in module.lora_A or name in module.merged_adapters:
            continue
        adapters.append((module.lora_B[name].weight, module.lora_A[name].weight, module.scaling[name]))
        if module.lora_bias.get(name, False):
            extra = module.lora_B[name].bias * module.scaling[name]
            bias = extra if bias is None else bias + extra
    return base.weight, bias, adapters


def _stack(modules: list, dtype, pack, only_base: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The linear layers `modules`, which read the same input, as one layer in `dtype` (LoRA
    adapters folded in, unless `only_base`), laid out by `pack` for the matmul that will use it.
    Each weight is read once: the copy into the stacked tensor is also the cast, and a LoRA merge
    is one addmm per adapter, in fp32. A single plain fp32 layer is not copied at all."""
    parts = [_linear_parts(m, only_base) for m in modules]
    if len(parts) == 1 and not parts[0][2]:
        weight = parts[0][0].to(dtype).contiguous()
    else:
        weight = torch.empty(
            (sum(w.shape[0] for w, _, _ in parts), parts[0][0].shape[1]), dtype=dtype, device=parts[0][0].device
        )
        for rows, (w, _, adapters) in zip(weight.split([w.shape[0] for w, _, _ in parts]), parts):
            for b, a, scale in adapters:
                w = torch.addmm(w, b, a, alpha=scale)
            rows.copy_(w)
    if all(b is None for _, b, _ in parts):
        return pack(weight), None
    bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b, _ in parts])
    return pack(weight), bias.to(dtype)


def _stack_adapters(modules: list, names: list[str], dtype) -> _Adapters:
    """Each adapter's factors for the linear layers `modules` stacked as one (see _Adapters)."""
    down: list[torch.Tensor] = []
    up: list[torch.Tensor] = []
    for name in names:
        missing = [m for m in modules if name not in getattr(m, "lora_A", {})]
        if missing:
            raise ValueError(f"adapter {name!r} is not on every projection")
        a = torch.cat([m.lora_A[name].weight for m in modules]).to(dtype)
        b = torch.block_diag(*[m.lora_B[name].weight * m.scaling[name] for m in modules]).to(dtype)
        down.append(a)
        up.append(b)
    return _Adapters(down, up)


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
    """A Llama-family causal LM's forward pass for decoding, on a `SharedPromptCache`.

    Built from the model's current weights (LoRA adapters merged, q/k/v and gate/up stacked,
    cast to `dtype`) at the start of each `decode_samples` call, so it always samples the policy
    as it is now. In bf16 the matmuls and the cache are bf16 while the residual stream, the
    norms, rotary embeddings and softmax stay fp32: the numerics of bf16 autocast. In fp32 it
    computes what the transformers forward computes, op for op, up to the summation order inside
    the matmul kernels (tests/training/test_decoding.py checks greedy tokens against generate).
    """

    def __init__(self, causal_lm, dtype: torch.dtype, rows: int = 32, adapters: list[str] | None = None):
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
        self.lm_head = _stack([causal_lm.lm_head], dtype, pack)[0]
        self.intermediate = config.intermediate_size
        # With `adapters`, a mixed batch: the base weights alone, and each named adapter's
        # factors applied to its own rows (Segments) at every projection.
        self.adapters = adapters
        mixed = adapters is not None
        self.layers = []
        for block in body.layers:
            attention, mlp = block.self_attn, block.mlp
            groups = (
                [attention.q_proj, attention.k_proj, attention.v_proj],
                [attention.o_proj],
                [mlp.gate_proj, mlp.up_proj],
                [mlp.down_proj],
            )
            (qkv, qkv_bias), (out, out_bias), (gate_up, gate_up_bias), (down, down_bias) = [
                _stack(group, dtype, pack, only_base=mixed) for group in groups
            ]
            loras: list[_Adapters | None] = (
                [_stack_adapters(group, adapters, dtype) for group in groups] if adapters is not None else [None] * 4
            )
            self.layers.append(
                _Layer(
                    block.input_layernorm.weight,
                    qkv,
                    qkv_bias,
                    out,
                    out_bias,
                    block.post_attention_layernorm.weight,
                    gate_up,
                    gate_up_bias,
                    down,
                    down_bias,
                    *loras,
                )
            )

    @staticmethod
    def unsupported(model) -> str | None:
        """Why `model` must decode through its own forward instead, or None if this decoder fits."""
        causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = getattr(causal_lm, "config", None)
        if config is None or getattr(config, "model_type", None) not in _SUPPORTED_TYPES:
            return f"model type {getattr(config, 'model_type', None)!r} is not one of {_SUPPORTED_TYPES}"
        if getattr(config, "hidden_act", None) != "silu":
            return f"activation {config.hidden_act!r} is not silu"
        if getattr(config, "use_sliding_window", False) or "sliding_attention" in (
            getattr(config, "layer_types", None) or ()
        ):
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
    def of(cls, model, dtype: torch.dtype, rows: int = 32, adapters: list[str] | None = None) -> LlamaDecoder | None:
        """This decoder for `model` (a transformers causal LM or a PEFT wrapper of one), its
        matmuls laid out for about `rows` rows; None if the model does not fit it. `adapters`:
        decode a mixed batch, each row with one of these LoRA adapters of `model`."""
        if cls.unsupported(model) is not None:
            return None
        return cls(model.get_base_model() if hasattr(model, "get_base_model") else model, dtype, rows, adapters)

    def project(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        lora: _Adapters | None,
        segments: Segments | None,
    ) -> torch.Tensor:
        """x's projection by the base weight, plus, on a mixed batch, each row's own adapter."""
        y = self.linear(x, weight, bias)
        if lora is not None and segments is not None:
            for adapter, start, end in segments:
                y[start:end] += F.linear(F.linear(x[start:end], lora.down[adapter]), lora.up[adapter])
        return y

    def new_cache(self, prompts: int, samples: int, prompt_length: int, new_tokens: int, device) -> SharedPromptCache:
        return SharedPromptCache(
            len(self.layers),
            prompts,
            samples,
            self.kv_heads,
            self.head_dim,
            prompt_length,
            new_tokens,
            self.dtype,
            device,
        )

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

    def prefill(
        self,
        input_ids: torch.Tensor,
        valid: torch.Tensor,
        positions: torch.Tensor,
        cache: SharedPromptCache,
        tables: tuple[torch.Tensor, torch.Tensor],
        segments: Segments | None = None,
    ) -> torch.Tensor:
        """Run the left-padded prompts `input_ids` [prompts, L] into the prompt part of `cache`;
        the logits [prompts, vocab] after each prompt's last token. `segments`: which prompts
        each adapter of a mixed batch decodes."""
        prompts, length = input_ids.shape
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        cos, sin = (t[positions].unsqueeze(2) for t in tables)  # [prompts, L, 1, head_dim]
        causal = torch.ones((length, length), dtype=torch.bool, device=input_ids.device).tril()
        # A padding query may see only itself: it must see something, or its softmax is NaN.
        mask = (causal & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=input_ids.device)
        mask = mask.unsqueeze(1)
        bias = torch.zeros((prompts, 1, length), dtype=self.dtype, device=input_ids.device)
        cache.prompt_bias = bias.masked_fill_(~valid[:, None, :], float("-inf")).repeat_interleave(kv_heads, dim=0)
        x = self.embed(input_ids).float()
        for index, layer in enumerate(self.layers):
            qkv = self.project(self._norm(x, layer.input_norm), layer.qkv, layer.qkv_bias, layer.qkv_lora, segments)
            qk = self._rotate(
                qkv[..., : (heads + kv_heads) * head_dim].unflatten(-1, (heads + kv_heads, head_dim)), cos, sin
            ).to(self.dtype)
            q = qk[:, :, :heads].transpose(1, 2)
            k = qk[:, :, heads:].transpose(1, 2)
            v = qkv[..., (heads + kv_heads) * head_dim :].unflatten(-1, (kv_heads, head_dim)).transpose(1, 2)
            cache.prompt_keys_t[index] = k.transpose(-1, -2)
            cache.prompt_values[index] = v
            if kv_heads != heads:
                k = k.repeat_interleave(heads // kv_heads, dim=1)
                v = v.repeat_interleave(heads // kv_heads, dim=1)
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + self.project(
                attended.transpose(1, 2).flatten(2), layer.out, layer.out_bias, layer.out_lora, segments
            )
            gate_up = self.project(
                self._norm(x, layer.post_norm), layer.gate_up, layer.gate_up_bias, layer.gate_up_lora, segments
            )
            x = x + self.project(
                F.silu(gate_up[..., : self.intermediate]) * gate_up[..., self.intermediate :],
                layer.down,
                layer.down_bias,
                layer.down_lora,
                segments,
            )
        return self._logits(x[:, -1])

    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: SharedPromptCache,
        tables: tuple[torch.Tensor, torch.Tensor],
        segments: Segments | None = None,
    ) -> torch.Tensor:
        """One token per live row of `cache` (`tokens` [rows]) written into its next generated
        column; the next logits [rows, vocab]. `segments`: each adapter's rows, on a mixed batch."""
        rows = tokens.shape[0]
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        qk_width = (heads + kv_heads) * head_dim
        column = cache.open_column()
        cos, sin = (t[positions].unsqueeze(1) for t in tables)  # [rows, 1, head_dim]
        x = self.embed(tokens).float()
        for index, layer in enumerate(self.layers):
            qkv = self.project(self._norm(x, layer.input_norm), layer.qkv, layer.qkv_bias, layer.qkv_lora, segments)
            qk = self._rotate(qkv[:, :qk_width].view(rows, heads + kv_heads, head_dim), cos, sin)
            cache.keys_t[index, :, :, :, column] = qk[:, heads:]
            cache.values[index, :, :, column] = qkv[:, qk_width:].view(rows, kv_heads, head_dim)
            attended = self._attend((qk[:, :heads] * head_dim**-0.5).to(self.dtype), cache, index)
            x = x + self.project(attended, layer.out, layer.out_bias, layer.out_lora, segments)
            gate_up = self.project(
                self._norm(x, layer.post_norm), layer.gate_up, layer.gate_up_bias, layer.gate_up_lora, segments
            )
            x = x + self.project(
                F.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :],
                layer.down,
                layer.down_bias,
                layer.down_lora,
                segments,
            )
        cache.column += 1
        return self._logits(x)

    def _attend(self, q: torch.Tensor, cache: SharedPromptCache, index: int) -> torch.Tensor:
        """Layer `index`'s attention for the scaled queries `q` [rows, heads, head_dim] of one step:
        [rows, heads x head_dim].

        Scores against the prompt come from one matmul per prompt and key/value head over its G
        samples' queries (rows that left are zeros there, and dropped after); scores against the
        row's own tokens from one small matmul per row and key/value head, the query heads that
        share a key/value head being that matmul's rows, so grouped-query attention needs no
        copies of the cache. One softmax spans both parts.
        """
        if cache.prompt_bias is None:
            raise ValueError("a decoding step needs the prompt part of the cache: run prefill first")
        rows, heads, head_dim = q.shape
        prompts, samples, length = cache.prompts, cache.samples, cache.prompt_length
        kv_heads, group, own = self.kv_heads, heads // self.kv_heads, cache.own_bias.shape[0]
        grouped = (
            q
            if cache.live is None
            else q.new_zeros((prompts * samples, heads, head_dim)).index_copy_(0, cache.slots, q)
        )
        grouped = grouped.view(prompts, samples, kv_heads, group, head_dim).transpose(1, 2)
        prompt_scores = torch.bmm(
            grouped.reshape(prompts * kv_heads, samples * group, head_dim), cache.prompt_keys_t[index].flatten(0, 1)
        ).add_(cache.prompt_bias)
        prompt_scores = prompt_scores.view(prompts, kv_heads, samples, group, length).transpose(1, 2)
        own_scores = torch.bmm(q.view(rows * kv_heads, group, head_dim), cache.keys_t[index].flatten(0, 1))
        own_scores = own_scores.add_(cache.own_bias)
        if cache.live is None:
            scores = torch.cat([prompt_scores, own_scores.view(prompts, samples, kv_heads, group, own)], dim=-1)
        else:
            scores = torch.cat([prompt_scores[cache.live], own_scores.view(rows, kv_heads, group, own)], dim=-1)
        weights = scores.softmax(dim=-1, dtype=torch.float32).to(self.dtype).view(rows, kv_heads, group, length + own)
        to_prompt = weights[..., :length]
        if cache.live is not None:
            to_prompt = weights.new_zeros((prompts * samples, kv_heads, group, length)).index_copy_(
                0, cache.slots, to_prompt
            )
        to_prompt = to_prompt.reshape(prompts, samples, kv_heads, group, length).transpose(1, 2)
        from_prompt = torch.bmm(
            to_prompt.reshape(prompts * kv_heads, samples * group, length), cache.prompt_values[index].flatten(0, 1)
        )
        from_prompt = from_prompt.view(prompts, kv_heads, samples, group, head_dim).transpose(1, 2)
        from_prompt = (
            from_prompt.reshape(rows, kv_heads, group, head_dim) if cache.live is None else from_prompt[cache.live]
        )
        from_own = torch.bmm(
            weights[..., length:].reshape(rows * kv_heads, group, own), cache.values[index].flatten(0, 1)
        )
        return (from_prompt + from_own.view(rows, kv_heads, group, head_dim)).reshape(rows, heads * head_dim)
