"""A Llama-family model's weights as `LlamaDecoder` (llama_decoder.py) multiplies them: the
linear layers that read one input stacked into one (q|k|v, gate|up), LoRA adapters folded in or
kept apart for a mixed batch, cast once and laid out for oneDNN's matmul on a CPU; and which
models fit at all."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Adapters:
    """A stacked layer's LoRA factors for each of several adapters (decoding a mixed batch):
    adapter i adds up[i] @ (down[i] @ x), where down[i] stacks the parts' A matrices
    ([parts x r, in]) and up[i] holds their scaled B matrices on its block diagonal."""

    down: list[torch.Tensor]
    up: list[torch.Tensor]


@dataclass(frozen=True)
class DecoderLayer:
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
    qkv_lora: Adapters | None = None
    out_lora: Adapters | None = None
    gate_up_lora: Adapters | None = None
    down_lora: Adapters | None = None


# Rows of a mixed batch, in order, by adapter: (adapter index, first row, end row).
Segments = list[tuple[int, int, int]]


SUPPORTED_TYPES = ("llama", "qwen2")


def is_plain_linear(module) -> bool:
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


def linear_parts(
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


def stack_linears(modules: list, dtype, pack, only_base: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The linear layers `modules`, which read the same input, as one layer in `dtype` (LoRA
    adapters folded in, unless `only_base`), laid out by `pack` for the matmul that will use it.
    Each weight is read once: the copy into the stacked tensor is also the cast, and a LoRA merge
    is one addmm per adapter, in fp32. A single plain fp32 layer is not copied at all."""
    parts = [linear_parts(m, only_base) for m in modules]
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


def stack_adapters(modules: list, names: list[str], dtype) -> Adapters:
    """Each adapter's factors for the linear layers `modules` stacked as one (see Adapters)."""
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
    return Adapters(down, up)


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise.default(x, weight, bias, "none", [], "")


def onednn_packer(dtype: torch.dtype, device: torch.device, rows: int):
    """On a CPU with oneDNN: a function that lays a weight out in oneDNN's blocked format for
    `rows`-row matmuls, done once here instead of inside every matmul, as F.linear does. Measured
    on one core at 32 rows: 1.4x the fp32 and 1.3x the bf16 matmul rate of F.linear. None elsewhere."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    try:
        probe = torch.ones((8, 8), dtype=dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(probe, rows)
        if not torch.equal(onednn_linear(torch.ones((2, 8), dtype=dtype), packed), torch.full((2, 8), 8, dtype=dtype)):
            return None
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    return lambda weight: torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def decoder_layers(body, dtype, pack, adapters: list[str] | None = None) -> list[DecoderLayer]:
    """The decoder blocks of a LlamaModel `body`, their projections stacked in `dtype` and laid out
    by `pack`. With `adapters` (a mixed batch) the base weights alone, and each named adapter's
    factors apart, to apply to its own rows (Segments) at every projection."""
    layers = []
    for block in body.layers:
        attention, mlp = block.self_attn, block.mlp
        groups = (
            [attention.q_proj, attention.k_proj, attention.v_proj],
            [attention.o_proj],
            [mlp.gate_proj, mlp.up_proj],
            [mlp.down_proj],
        )
        (qkv, qkv_bias), (out, out_bias), (gate_up, gate_up_bias), (down, down_bias) = [
            stack_linears(group, dtype, pack, only_base=adapters is not None) for group in groups
        ]
        loras: list[Adapters | None] = (
            [stack_adapters(group, adapters, dtype) for group in groups] if adapters is not None else [None] * 4
        )
        layers.append(
            DecoderLayer(
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
    return layers


def unsupported(model) -> str | None:
    """Why `model` (a causal LM or a PEFT wrapper of one) cannot be decoded by LlamaDecoder, or None
    if it can."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(causal_lm, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {SUPPORTED_TYPES}"
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
        if any(m is None or not is_plain_linear(m) for m in linears):
            return "a projection that is not a linear layer or a plain LoRA adapter on one"
    if not is_plain_linear(causal_lm.lm_head):
        return "an lm_head that is not a linear layer"
    return None
