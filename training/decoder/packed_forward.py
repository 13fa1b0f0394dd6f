"""The update's forward pass for Llama-family models, on rows packed end to end.

A pass over some rows of a round lays out, for each question group among them, the group's
prompt once and then each row's completion, one token after another with no padding: every
linear layer multiplies exactly the real tokens, as one [tokens x in] matrix. Attention keeps
the rows apart with a mask: a prompt token sees the prompt before it, a completion token sees
its prompt and its own completion before it. Positions restart after the prompt for each row, so
a row's log-probs are those of the row run alone.

The frozen base weights (a LoRA policy's; training/models/policy.py) need no gradient, so each is
multiplied in `dtype` from a copy made once per update (q|k|v and gate|up stacked into one
matmul each), and its backward is the input gradient alone. LoRA factors, and any weight that
trains (full fine-tuning), take part in fp32 with autograd, from the modules themselves. The
residual stream, norms, rotary embeddings, the vocabulary projection and the log-softmax stay
fp32 in either precision, and so does attention (its q, k and v come out of the projections
widened to fp32): in bf16 only the base's matmuls round to bf16, with fp32 accumulation.

Which models fit is LlamaDecoder's test (training/decoder/llama_decoder.py); any other runs through its
own forward (training/learning/update.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sapo.training.decoder.decoder_weights import linear_parts
from sapo.training.decoder.llama_decoder import LlamaDecoder


@dataclass(frozen=True)
class PackedRows:
    """Some rows of a batch packed end to end, each group's prompt once (see the module's doc)."""

    ids: torch.Tensor  # [T] token ids
    positions: torch.Tensor  # [T] each token's position in its own row
    spans: list[tuple[int, int, list[int]]]  # per group: first token, prompt length, completion lengths
    predictors: torch.Tensor  # [N] the token whose logits predict each completion token, in row order
    targets: torch.Tensor  # [N] each completion token
    lengths: list[int]  # per row, in the order given: its completion length

    def masks(self, device) -> list[torch.Tensor]:
        """Per group, which earlier tokens each token may attend to ([Tg, Tg], True = attend)."""
        masks = []
        for _, prompt, completions in self.spans:
            segment = torch.repeat_interleave(torch.arange(len(completions) + 1), torch.tensor([prompt, *completions]))
            width = segment.shape[0]
            causal = torch.ones((width, width), dtype=torch.bool).tril()
            same = (segment[:, None] == segment[None, :]) | (segment[None, :] == 0)
            masks.append((causal & same).to(device))
        return masks


def pack_rows(
    prompts: list[list[int]], completions: list[list[int]], group_of: list[int], rows: list[int]
) -> PackedRows:
    """`rows` (indices into `completions`), packed group by group in the order they come; rows of
    one group must be adjacent in `rows`."""
    ids: list[int] = []
    positions: list[int] = []
    spans: list[tuple[int, int, list[int]]] = []
    predictors: list[int] = []
    targets: list[int] = []
    index, done = 0, set()
    while index < len(rows):
        group = group_of[rows[index]]
        if group in done:
            raise ValueError(f"the rows of group {group} are not adjacent in {rows}")
        done.add(group)
        members = []
        while index < len(rows) and group_of[rows[index]] == group:
            members.append(rows[index])
            index += 1
        prompt, start = prompts[group], len(ids)
        ids += prompt
        positions += range(len(prompt))
        for row in members:
            completion = completions[row]
            predictors += [start + len(prompt) - 1] + list(range(len(ids), len(ids) + len(completion) - 1))
            targets += completion
            ids += completion
            positions += range(len(prompt), len(prompt) + len(completion))
        spans.append((start, len(prompt), [len(completions[r]) for r in members]))
    return PackedRows(
        torch.tensor(ids),
        torch.tensor(positions),
        spans,
        torch.tensor(predictors),
        torch.tensor(targets),
        [len(completions[r]) for r in rows],
    )


def fits(model) -> bool:
    """Whether `model` runs on this forward (the Llama family, as LlamaDecoder reads it)."""
    return LlamaDecoder.unsupported(model) is None


def causal_lm_of(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@dataclass(frozen=True)
class _Projection:
    """Linear layers that read the same input, as one: the frozen base weight stacked in the
    compute dtype (None when the weights train), and the modules, for their trainable parts."""

    modules: tuple
    frozen: torch.Tensor | None
    frozen_bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """x [T, in] -> [T, out] fp32: the base in `dtype`, plus the parts' LoRA in fp32."""
        parts = [linear_parts(m) for m in self.modules]
        if self.frozen is not None:
            y = F.linear(x.to(dtype), self.frozen, self.frozen_bias)
        else:  # weights that train: a differentiable cast and stack each pass
            weight = torch.cat([w for w, _, _ in parts]).to(dtype)
            biases = [b for _, b, _ in parts]
            bias = (
                None
                if all(b is None for b in biases)
                else torch.cat(
                    [b if b is not None else w.new_zeros(w.shape[0]) for (w, _, _), b in zip(parts, biases)]
                ).to(dtype)
            )
            y = F.linear(x.to(dtype), weight, bias)
        if not any(adapters for _, _, adapters in parts):
            return y.float()
        x = x.float()
        if all(len(adapters) == 1 for _, _, adapters in parts):
            # one adapter per part (the usual LoRA): the parts' A stacked, their scaled B on a
            # block diagonal, so a stacked projection's LoRA is two matmuls whatever its parts
            down = torch.cat([a for _, _, ((_, a, _),) in parts]) if len(parts) > 1 else parts[0][2][0][1]
            up = torch.block_diag(*[b * scale for _, _, ((b, _, scale),) in parts])
            delta = F.linear(F.linear(x, down), up)
        else:
            deltas = []
            for w, _, adapters in parts:
                part = x.new_zeros((x.shape[0], w.shape[0]))
                for b, a, scale in adapters:
                    part = part + F.linear(F.linear(x, a), b) * scale
                deltas.append(part)
            delta = torch.cat(deltas, dim=-1)
        return delta + y  # one kernel that also widens a bf16 base output to fp32


def _projection(modules: list, dtype: torch.dtype) -> _Projection:
    parts = [linear_parts(m, only_base=False) for m in modules]
    weights = [w for w, _, _ in parts]
    if any(w.requires_grad for w in weights):
        return _Projection(tuple(modules), None, None)
    with torch.no_grad():
        stacked = torch.cat(weights).to(dtype) if len(weights) > 1 else weights[0].to(dtype)
        # LoRA biases train; only a plain frozen bias is folded in here
        biases = [getattr(m, "base_layer", m).bias for m in modules]
        bias = (
            None
            if all(b is None for b in biases)
            else torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)]).to(dtype)
        )
    return _Projection(tuple(modules), stacked, bias)


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.nn.Module
    qkv: _Projection
    out: _Projection
    post_norm: torch.nn.Module
    gate_up: _Projection
    down: _Projection


class PackedForward:
    """The policy's completion log-probs on packed rows; built once per update (the frozen
    weights' copies), run once per pass."""

    def __init__(self, model, dtype: torch.dtype = torch.float32):
        causal_lm = causal_lm_of(model)
        config, body = causal_lm.config, causal_lm.model
        self.config, self.dtype = config, dtype
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.intermediate = config.intermediate_size
        self.embed, self.norm, self.rotary = body.embed_tokens, body.norm, body.rotary_emb
        self.lm_head = _projection([causal_lm.lm_head], torch.float32)  # fp32 logits in either precision
        self.layers = []
        for block in body.layers:
            attention, mlp = block.self_attn, block.mlp
            self.layers.append(
                _Layer(
                    block.input_layernorm,
                    _projection([attention.q_proj, attention.k_proj, attention.v_proj], dtype),
                    _projection([attention.o_proj], dtype),
                    block.post_attention_layernorm,
                    _projection([mlp.gate_proj, mlp.up_proj], dtype),
                    _projection([mlp.down_proj], dtype),
                )
            )

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin per token [T, 1, head_dim] (see LlamaDecoder.rotary_tables)."""
        cos, sin = self.rotary(torch.empty(0, device=positions.device, dtype=torch.float32), positions[None])
        half = self.head_dim // 2
        signed = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
        return cos[0].float().unsqueeze(1), signed.float().unsqueeze(1)

    def _attend(self, qkv: torch.Tensor, cos, sin, packed: PackedRows, masks: list[torch.Tensor]) -> torch.Tensor:
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        tokens = qkv.shape[0]
        # split, not slices: a slice's backward fills a zero tensor of the whole width first
        qk, v = qkv.split([(heads + kv_heads) * head_dim, kv_heads * head_dim], dim=-1)
        qk = qk.view(tokens, heads + kv_heads, head_dim)
        qk = qk * cos + qk.roll(head_dim // 2, dims=-1) * sin
        q, k = qk.split([heads, kv_heads], dim=1)
        v = v.view(tokens, kv_heads, head_dim).float()
        if kv_heads != heads:
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
        outputs = []
        for (start, prompt, completions), mask in zip(packed.spans, masks):
            end = start + prompt + sum(completions)
            # each [1, heads, Tg, head_dim]
            q_part, k_part, v_part = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            outputs.append(F.scaled_dot_product_attention(q_part, k_part, v_part, attn_mask=mask)[0].transpose(0, 1))
        return torch.cat(outputs).reshape(tokens, heads * head_dim)

    def logprobs(self, packed: PackedRows, device) -> torch.Tensor:
        """log p of each completion token [N] (packed.targets' order), under the model now."""
        masks = packed.masks(device)
        cos, sin = self._rotary(packed.positions.to(device))
        x = self.embed(packed.ids.to(device)).float()
        for layer in self.layers:
            qkv = layer.qkv(_rms_norm(x, layer.input_norm), self.dtype)
            x = x + layer.out(self._attend(qkv, cos, sin, packed, masks), self.dtype)
            gate_up = layer.gate_up(_rms_norm(x, layer.post_norm), self.dtype)
            x = x + layer.down(_SwiGLU.apply(gate_up, self.intermediate), self.dtype)
        hidden = _rms_norm(x.index_select(0, packed.predictors.to(device)), self.norm)
        logits = self.lm_head(hidden, torch.float32)
        targets = packed.targets.to(device)
        return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) x up of one [T, 2 x I] gate|up tensor. Its backward writes both halves'
    gradients into one [T, 2 x I] tensor, where autograd would make each and concatenate them."""

    @staticmethod
    def forward(ctx, gate_up: torch.Tensor, width: int) -> torch.Tensor:
        gate, up = gate_up.split(width, dim=-1)
        activated = F.silu(gate)
        ctx.save_for_backward(gate_up, activated)
        ctx.width = width
        return activated * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate_up, activated = ctx.saved_tensors
        gate, up = gate_up.split(ctx.width, dim=-1)
        out = torch.empty_like(gate_up)
        grad_gate, grad_up = out.split(ctx.width, dim=-1)
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=grad_gate)
        torch.mul(grad, activated, out=grad_up)
        return out, None


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def unpack(values: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token values [N] as rows right-padded to the longest: ([rows, C], mask [rows, C])."""
    width = max(lengths)
    rows = torch.arange(len(lengths)).repeat_interleave(torch.tensor(lengths))
    columns = torch.cat([torch.arange(n) for n in lengths])
    flat = (rows * width + columns).to(values.device)
    out = values.new_zeros(len(lengths) * width).index_copy(0, flat, values).view(len(lengths), width)
    mask = torch.zeros(len(lengths) * width, device=values.device)
    mask[flat] = 1.0
    return out, mask.view(len(lengths), width)
