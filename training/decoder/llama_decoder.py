"""`LlamaDecoder`: one decoding step of a Llama-family model (Llama, SmolLM2, Qwen2, the tiny
test models; LoRA merged in) on a static, preallocated KV cache shared by each prompt's G
samples (decoder_cache.py), with its weights stacked and laid out once per call
(decoder_weights.py). Why it exists, and what runs any other model: decoding.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sapo.training.decoder.decoder_cache import SharedPromptCache
from sapo.training.decoder.decoder_weights import (
    Adapters,
    Segments,
    decoder_layers,
    onednn_linear,
    onednn_packer,
    stack_linears,
    unsupported,
)


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
        packer = onednn_packer(dtype, device, rows)
        self.linear = F.linear if packer is None else onednn_linear
        pack = packer or (lambda weight: weight)
        self.lm_head = stack_linears([causal_lm.lm_head], dtype, pack)[0]
        self.intermediate = config.intermediate_size
        # With `adapters`, a mixed batch: the base weights alone, and each named adapter's
        # factors applied to its own rows (Segments) at every projection.
        self.adapters = adapters
        self.layers = decoder_layers(body, dtype, pack, adapters)

    @staticmethod
    def unsupported(model) -> str | None:
        """Why `model` must decode through its own forward instead, or None if this decoder fits."""
        return unsupported(model)

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
        lora: Adapters | None,
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
