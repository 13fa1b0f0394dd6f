"""bench/compile.py's compilable decoder: LlamaDecoder (training/llama_decoder.py) with a step that
torch.compile can take whole or per layer, and the packed oneDNN matmul registered as an op
inductor leaves alone."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from unittest import mock

import torch

# --- the packed matmul as an op inductor leaves alone ----------------------------------------------


@torch.library.custom_op("sapo_bench::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    from sapo.training.llama_decoder import _onednn_linear

    return _onednn_linear(x, weight, bias)


@onednn_linear.register_fake
def _(x, weight, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


# --- LlamaDecoder with a compilable step ------------------------------------------------------------


@dataclass
class _LayerCache:
    """What LlamaDecoder._attend reads of a SharedPromptCache, for one layer (as its layer 0), so
    that one compiled graph serves every layer (a layer index would be specialized on)."""

    prompts: int
    samples: int
    prompt_length: int
    prompt_keys_t: torch.Tensor
    prompt_values: torch.Tensor
    prompt_bias: torch.Tensor
    keys_t: torch.Tensor
    values: torch.Tensor
    own_bias: torch.Tensor
    live: tuple[torch.Tensor, torch.Tensor] | None
    slots: torch.Tensor


def _layer_step(decoder, layer, x, cos, sin, column: torch.Tensor, cache: _LayerCache) -> torch.Tensor:
    """LlamaDecoder.step's loop body for one layer, the column written by index_copy_."""
    rows = x.shape[0]
    heads, kv_heads, head_dim = decoder.heads, decoder.kv_heads, decoder.head_dim
    qk_width = (heads + kv_heads) * head_dim
    qkv = decoder.project(decoder._norm(x, layer.input_norm), layer.qkv, layer.qkv_bias, None, None)
    qk = decoder._rotate(qkv[:, :qk_width].view(rows, heads + kv_heads, head_dim), cos, sin)
    cache.keys_t[0].index_copy_(-1, column, qk[:, heads:].to(decoder.dtype).unsqueeze(-1))
    cache.values[0].index_copy_(2, column, qkv[:, qk_width:].view(rows, kv_heads, 1, head_dim))
    attended = decoder._attend((qk[:, :heads] * head_dim**-0.5).to(decoder.dtype), cache, 0)
    x = x + decoder.project(attended, layer.out, layer.out_bias, None, None)
    gate_up = decoder.project(decoder._norm(x, layer.post_norm), layer.gate_up, layer.gate_up_bias, None, None)
    gated = torch.nn.functional.silu(gate_up[:, : decoder.intermediate]) * gate_up[:, decoder.intermediate :]
    return x + decoder.project(gated, layer.down, layer.down_bias, None, None)


def _layers_step(decoder, x, cos, sin, column, caches: list[_LayerCache], layer_fn) -> torch.Tensor:
    for layer, cache in zip(decoder.layers, caches):
        x = layer_fn(decoder, layer, x, cos, sin, column, cache)
    return x


class CompiledDecoder:
    """Builds LlamaDecoder subclasses whose step runs `_layer_step` compiled per layer or whole.

    The compiled functions live on the class, not the instance, so that each round's new decoder
    (new weights, the same shapes) reuses the code compiled in earlier rounds."""

    @staticmethod
    def make(granularity: str, packed: bool, compile_kwargs: dict):
        from sapo.training import llama_decoder

        layer_fn = _layer_step
        body = _layers_step
        if granularity == "layer":
            layer_fn = torch.compile(_layer_step, **compile_kwargs)
        else:
            body = torch.compile(_layers_step, **compile_kwargs)

        class Decoder(llama_decoder.LlamaDecoder):
            def __init__(self, causal_lm, dtype, rows=32, adapters=None):
                if adapters is not None:
                    raise ValueError("a mixed batch is not benchmarked here")
                if packed:
                    super().__init__(causal_lm, dtype, rows)
                    if self.linear is llama_decoder._onednn_linear:
                        self.linear = onednn_linear
                else:  # plain weights, F.linear: what inductor can see into
                    with mock.patch.object(llama_decoder, "_onednn_packer", lambda *a: None):
                        super().__init__(causal_lm, dtype, rows)

            def step(self, tokens, positions, cache, tables, segments=None):
                if segments is not None:
                    raise ValueError("a mixed batch is not benchmarked here")
                column = torch.tensor([cache.open_column()], device=tokens.device)
                cos, sin = (t[positions].unsqueeze(1) for t in tables)
                caches = [
                    _LayerCache(
                        cache.prompts,
                        cache.samples,
                        cache.prompt_length,
                        cache.prompt_keys_t[i : i + 1],
                        cache.prompt_values[i : i + 1],
                        cache.prompt_bias,
                        cache.keys_t[i : i + 1],
                        cache.values[i : i + 1],
                        cache.own_bias,
                        cache.live,
                        cache.slots,
                    )
                    for i in range(len(self.layers))
                ]
                x = body(self, self.embed(tokens).float(), cos, sin, column, caches, layer_fn)
                cache.column += 1
                return self._logits(x)

        return Decoder


def compiled(variant: str, policy, compile_kwargs: dict):
    """A context-manager factory: inside, decode_samples (or the model's forward, for `hf static`)
    runs `variant`. Made once per variant, so that every pass reuses what the first compiled."""
    from sapo.training import decoding

    if variant.startswith(("layer/", "step/")):
        granularity, kernel = variant.split("/")
        decoder = CompiledDecoder.make(granularity, kernel == "oneDNN op", compile_kwargs)
        return lambda: mock.patch.object(decoding, "LlamaDecoder", decoder)
    if variant == "hf static":
        forward = torch.compile(policy.model.forward, **compile_kwargs)

        @contextlib.contextmanager
        def compiled_forward():
            policy.model.forward = forward
            try:
                yield
            finally:
                del policy.model.forward  # the class's own forward again

        return compiled_forward
    raise ValueError(f"unknown variant {variant!r}")
