"""The GRPO update's compute bound: the matmul FLOPs it must do, at the matmul rate one thread reaches.

With a frozen base (LoRA), an update needs, per token of each pass, a forward through every
linear layer and the gradient with respect to each layer's input (the same FLOPs again), but
no gradient for any base weight (full fine-tuning adds each weight's gradient: the forward's
FLOPs once more). The vocabulary projection (lm_head) runs for completion positions only. So,
counting linear layers only (attention, norms and the LoRA factors are a few percent of a
SmolLM2 token's FLOPs):

    per pass  = 2 x 2 x (layer weights x (prompt + completion tokens) + vocab x hidden x completion tokens)
    update    = updates_per_batch passes, plus a forward (half the above) over the rows that the
                first step does not cover (the old log-probs: 1 - 1/minibatches of them)

Each group's prompt counts once per pass (the packed layout runs it once). The rate is
measured here, on one thread and the process's CPU clock, for each of the model's linear shapes
at `rows` rows (about a pass's tokens), fp32 and bf16, with the better of F.linear and oneDNN's
packed kernel, the weights streamed from memory; the bound divides each shape's FLOPs by its
own rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.matmul_rate import Clock, matmul_gflops, streamed_weights


@dataclass(frozen=True)
class UpdateWork:
    """What one update computes over: its tokens and its passes."""

    prompt_tokens: int  # over the update's question groups, each prompt once
    completion_tokens: int
    updates_per_batch: int
    minibatches: int
    weight_gradients: bool = False  # full fine-tuning: the backward also multiplies for every weight's gradient

    @property
    def old_logprob_share(self) -> float:
        """The rows whose old log-probs need a pass of their own: all but the first step's."""
        return 1.0 - 1.0 / max(1, self.minibatches)


def linear_shapes(config) -> dict[str, tuple[int, int, int]]:
    """(out, in, times per token) of each linear layer of a Llama-family model, lm_head last."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    hidden, mlp, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    return {
        "q, o": (heads * head_dim, hidden, 2 * layers),
        "k, v": (kv, hidden, 2 * layers),
        "gate, up": (mlp, hidden, 2 * layers),
        "down": (hidden, mlp, layers),
        "lm_head": (config.vocab_size, hidden, 1),
    }


def update_flops(config, work: UpdateWork) -> dict[str, float]:
    """Matmul FLOPs of the update per shape: forward and input-gradient backward."""
    tokens = work.prompt_tokens + work.completion_tokens
    backward = 2 if work.weight_gradients else 1
    passes = (
        work.updates_per_batch * (1 + backward) + work.old_logprob_share
    )  # fwd+bwd a pass, fwd alone for old log-probs
    flops = {}
    for name, (out, inp, count) in linear_shapes(config).items():
        positions = work.completion_tokens if name == "lm_head" else tokens
        flops[name] = 2.0 * out * inp * count * positions * passes
    return flops


def matmul_rates(config, rows: int = 256, seconds: float = 0.1, stream_mb: float = 64) -> dict[str, dict[str, float]]:
    """GFLOPS per shape and dtype ('fp32', 'bf16'), the better of F.linear and the packed kernel."""
    clock = Clock(torch.device("cpu"))  # the bound is this CPU thread's: its CPU clock
    rates: dict[str, dict[str, float]] = {"fp32": {}, "bf16": {}}
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for name, (out, inp, _) in linear_shapes(config).items():
            weights = streamed_weights(out, inp, dtype, stream_mb * 2**20)
            best = max(matmul_gflops(weights, rows, kernel, seconds, clock) for kernel in ("F.linear", "packed"))
            rates[dtype_name][name] = best
            del weights
    return rates


def bound_seconds(flops: dict[str, float], rates: dict[str, float]) -> float:
    return sum(f / (rates[name] * 1e9) for name, f in flops.items())
