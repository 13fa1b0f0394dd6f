"""Decoding against its roofline: this machine's matmul rates at the model's own shapes.

A decoding step for B rows multiplies a [B x in] activation by every weight matrix of the
model once, so its time is at best the sum over the model's linear layers of
2 x B x in x out / (that shape's matmul rate at B rows), and it cannot beat reading every weight
(and each row's KV cache) from memory once either:

    compute bound   = B / sum over layers of (2 B in out / FLOPS(shape, B))   tokens/s
    bandwidth bound = B x bandwidth / (weight bytes + B x KV bytes per token x context)
    roofline        = min(compute bound, bandwidth bound)

Printed, on one torch thread and timed on the process's CPU clock (so that other jobs on the
machine hide little; the load average says how much they could):

1. matmul GFLOPS at every distinct linear shape of the model (q, k/v, o, gate/up, down, the
   lm_head, and the stacked q|k|v and gate|up that training/decoding.py multiplies by), at
   B = 1, 8, 32, 64, fp32 and bf16, with the weights streamed from memory as in a real step
   (enough distinct copies to overflow the caches); for F.linear (what transformers uses) and
   for oneDNN with weights packed once (what LlamaDecoder uses);
2. copy bandwidth (bench/bandwidth.py) and each shape's share of a token's FLOPs;
3. decoding tokens per CPU second at each B against the roofline, for LlamaDecoder in fp32
   and bf16 (decode_samples) and for transformers' `generate` (fp32): every row runs the full
   `--steps` (no EOS), and the prefill is taken out by subtracting a 1-token run;
4. one real `sample_completions` round (4 prompts x 8 samples, early stops), end to end.

    .venv/bin/python bench/roofline.py                       # smollm2-135m, about 5 minutes
    .venv/bin/python bench/roofline.py --batches 8,32 --no-hf
    .venv/bin/python bench/roofline.py --smoke               # tiny, seconds
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bandwidth import DecodeGeometry, copy_bandwidth_gbs, decode_bound_tokens_per_s
from round import print_rows

DEFAULT_MODELS_DIR = Path(__file__).resolve().parent / ".cache" / "models"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Linear:
    name: str
    out: int
    inp: int
    count: int  # times per token (layers)
    decoder: bool  # multiplied by LlamaDecoder (stacked shapes) rather than by the model's own modules

    def flops(self, batch: int) -> float:
        return 2.0 * batch * self.out * self.inp * self.count


def model_linears(config) -> list[Linear]:
    """Every linear layer a token passes through, as the model has them and as LlamaDecoder stacks them."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    hidden, mlp, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    return [
        Linear("q", heads * head_dim, hidden, layers, False),
        Linear("k, v", kv, hidden, 2 * layers, False),
        Linear("o", hidden, heads * head_dim, layers, True),
        Linear("gate, up", mlp, hidden, 2 * layers, False),
        Linear("down", hidden, mlp, layers, True),
        Linear("lm_head", config.vocab_size, hidden, 1, True),
        Linear("q|k|v", heads * head_dim + 2 * kv, hidden, layers, True),
        Linear("gate|up", 2 * mlp, hidden, layers, True),
    ]


def streamed_weights(out: int, inp: int, dtype: torch.dtype, stream_bytes: float) -> list[torch.Tensor]:
    """Distinct copies of an [out x in] weight, more bytes of them than the caches hold."""
    copies = max(1, math.ceil(stream_bytes / (out * inp * torch.tensor([], dtype=dtype).element_size())))
    return [torch.randn(out, inp).mul_(0.02).to(dtype) for _ in range(copies)]


def matmul_gflops(weights: list[torch.Tensor], batch: int, kernel: str, seconds: float) -> float:
    """GFLOPS of [batch x in] @ [in x out], cycling through `weights` so that each call reads its
    weight from memory, as a decoding step does (best of 3 rounds); NaN without the kernel."""
    out, inp = weights[0].shape
    x = torch.randn(batch, inp).to(weights[0].dtype)
    linear = F.linear
    if kernel == "packed":  # training/decoding.py's kernel
        from sapo.training.llama_decoder import _onednn_linear, _onednn_packer

        packer, linear = _onednn_packer(weights[0].dtype, torch.device("cpu"), batch), _onednn_linear
        if packer is None:
            return float("nan")
        weights = [packer(w) for w in weights]
    started = time.process_time()
    for w in weights:  # warm-up, and the time of one call
        linear(x, w)
    per_call = (time.process_time() - started) / len(weights)
    flops = 2.0 * batch * out * inp
    calls = max(len(weights), int(seconds / max(per_call, 1e-7)))
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for i in range(calls):
            linear(x, weights[i % len(weights)])
        best = min(best, time.process_time() - started)
    return calls * flops / best / 1e9


# --- decoding --------------------------------------------------------------------------------------


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


def ours_cpu_seconds(policy, prompts: list[str], batch: int, steps: int, dtype: torch.dtype) -> float:
    from sapo.training.decoding import decode_samples

    chosen, samples = layout(batch, prompts)
    started = time.process_time()
    decode_samples(policy.model, _NoEndOfText(policy.tokenizer), chosen, samples_per_prompt=samples,
                   max_new_tokens=steps, temperature=1.0, seed=0, device=policy.device, weights_dtype=dtype)
    return time.process_time() - started


def hf_cpu_seconds(policy, prompts: list[str], batch: int, steps: int, dtype: torch.dtype) -> float:
    chosen, samples = layout(batch, prompts)
    tokenizer = policy.tokenizer
    tokenizer.padding_side = "left"
    enc = tokenizer([p for p in chosen for _ in range(samples)], return_tensors="pt", padding=True,
                    add_special_tokens=False)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == torch.bfloat16 else torch.autocast("cpu", enabled=False)
    torch.manual_seed(0)
    started = time.process_time()
    with torch.inference_mode(), autocast:
        policy.model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=steps,
                              min_new_tokens=steps, pad_token_id=tokenizer.pad_token_id)
    return time.process_time() - started


def decode_tokens_per_cpu_s(measure, policy, prompts, batch: int, steps: int, dtype) -> float:
    """Decoding alone: (steps - 1) tokens per row over the time a `steps` run takes beyond a 1-step
    run (which is the prefill, the first token and the setup)."""
    measure(policy, prompts, batch, 2, dtype)  # warm-up: first-call costs of this shape
    full = measure(policy, prompts, batch, steps, dtype)
    first = min(measure(policy, prompts, batch, 1, dtype) for _ in range(2))
    return batch * (steps - 1) / max(full - first, 1e-9)


def real_round(policy, prompts: list[str], max_new_tokens: int) -> tuple[int, float]:
    from sapo.training.generation import sample_completions

    started = time.process_time()
    _, tokens, _ = sample_completions(policy, prompts[:4], num_generations=8, max_new_tokens=max_new_tokens, seed=1)
    return tokens, time.process_time() - started


# --- the report ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="model name (a tiny variant, smollm2-135m, a local HF directory)")
    parser.add_argument("--batches", default="1,8,32,64", help="decode batch sizes")
    parser.add_argument("--steps", type=int, default=48, help="decoding steps per row in the decode measurements")
    parser.add_argument("--matmul-seconds", type=float, default=0.15, help="about how long each matmul rate is timed")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: what a node sharing its CPU uses)")
    parser.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True, help="also time transformers' generate (fp32)")
    parser.add_argument("--stream-mb", type=float, default=96,
                        help="bytes of distinct weight copies each matmul cycles through (above the L3 size: 32 MB here)")
    parser.add_argument("--bandwidth-mb", type=float, default=256, help="size of the copy that measures bandwidth")
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR, help="converted-model cache")
    parser.add_argument("--smoke", action="store_true", help="tiny model, batches 1 and 8, few steps: a quick check it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.batches, args.steps, args.matmul_seconds, args.bandwidth_mb = "tiny", "1,8", 4, 0.01, 16
        args.stream_mb = 2
    args.batch_list = [int(b) for b in args.batches.split(",") if b.strip()]
    if args.steps < 2 or not args.batch_list or min(args.batch_list) < 1:
        parser.error("--steps must be >= 2 and --batches positive")
    return args


def cpu_flags() -> str:
    flags = [name for name, probe in (("avx512", "_is_avx512_supported"), ("avx512_bf16", "_is_avx512_bf16_supported"),
                                      ("amx", "_is_amx_tile_supported")) if getattr(torch.cpu, probe, lambda: False)()]
    return ", ".join(flags) or "no AVX-512"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from sapo.training.policy import load_policy
    from sapo.training.tasks import TaskSampler, default_task_specs

    args.models_dir.mkdir(parents=True, exist_ok=True)
    policy = load_policy(args.model, device="cpu", seed=0, models_dir=args.models_dir, generation_precision="fp32")
    config = policy.model.config
    linears = model_linears(config)
    print(f"roofline of decoding {args.model}: torch {torch.__version__}, {args.threads} thread(s), CPU clock")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs ({cpu_flags()}), python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f} at the start (CONTENDED when above about 0.5)")

    # 1. matmul rates
    rates: dict[tuple[str, str, int, str], float] = {}
    rows = [["shape", "out x in", "dtype"] + [f"B={b} F.linear / packed" for b in args.batch_list]]
    distinct = {}
    for linear in linears:
        distinct.setdefault((linear.out, linear.inp), linear.name)
    for (out, inp), name in distinct.items():
        for dtype_name, dtype in DTYPES.items():
            cells = []
            weights = streamed_weights(out, inp, dtype, args.stream_mb * 2**20)
            for b in args.batch_list:
                for kernel in ("F.linear", "packed"):
                    rates[(f"{out}x{inp}", dtype_name, b, kernel)] = matmul_gflops(weights, b, kernel, args.matmul_seconds)
                cells.append(f"{rates[(f'{out}x{inp}', dtype_name, b, 'F.linear')]:.0f} / "
                             f"{rates[(f'{out}x{inp}', dtype_name, b, 'packed')]:.0f}")
            rows.append([name, f"{out} x {inp}", dtype_name] + cells)
    print()
    print("matmul GFLOPS, weights streamed from memory (F.linear / oneDNN with the weight packed once)")
    print_rows(rows)

    # 2. FLOPs shares and bandwidth
    model_own = [lin for lin in linears if lin.name not in ("q|k|v", "gate|up")]
    total = sum(lin.flops(1) for lin in model_own)
    print()
    print(f"FLOPs per token in linear layers: {total / 1e6:.1f} M (2 x {total / 2e6:.1f} M weights); share: "
          + ", ".join(f"{lin.name} {100 * lin.flops(1) / total:.1f}%" for lin in model_own))
    bandwidth = copy_bandwidth_gbs(args.bandwidth_mb, repeats=3, threads=args.threads)
    geometry = DecodeGeometry.of(policy.model)
    print(f"copy bandwidth: {bandwidth:.1f} GB/s; weights {geometry.weight_bytes / 1e6:.0f} MB in fp32; "
          f"KV cache {geometry.kv_bytes_per_token / 1e3:.1f} kB per token in fp32")

    # 3. decoding against the roofline
    tasks = TaskSampler(default_task_specs(["basic_arithmetic"]), dataset_seed=0, rng_seed=0)
    prompts = [policy.prompt(p) for p in tasks.sample(4)]
    prompt_tokens = max(len(ids) for ids in policy.tokenizer(prompts, add_special_tokens=False)["input_ids"])
    context = prompt_tokens + args.steps / 2

    def roof(dtype_name: str, batch: int, decoder: bool) -> tuple[float, float]:
        used = [lin for lin in linears if (lin.decoder if decoder else lin not in linears[-2:])]
        seconds = sum(lin.flops(batch) / 1e9 / max(rates[(f"{lin.out}x{lin.inp}", dtype_name, batch, kernel)]
                                                    for kernel in (("F.linear", "packed") if decoder else ("F.linear",)))
                      for lin in used)
        scale = 0.5 if dtype_name == "bf16" else 1.0
        bytes_geometry = DecodeGeometry(int(geometry.weight_bytes * scale), int(geometry.kv_bytes_per_token * scale))
        return batch / seconds, decode_bound_tokens_per_s(bytes_geometry, batch, context, bandwidth)

    print()
    print(f"decoding, tokens per CPU second ({args.steps} steps per row, prefill excluded; context {prompt_tokens} "
          f"prompt + {args.steps // 2} mean generated tokens). roof = min(compute bound at the best measured kernel "
          f"per shape, bandwidth bound); 'F.linear roof' = compute bound with F.linear alone (what generate multiplies with)")
    header = ["B", "fp32 compute / bandwidth roof", "ours fp32", "% of roof", "bf16 compute / bandwidth roof",
              "ours bf16", "% of roof", "% of fp32 roof"]
    if args.hf:
        header += ["F.linear fp32 roof", "generate fp32", "% of it"]
    table = [header]
    for batch in args.batch_list:
        fp32_compute, fp32_bw = roof("fp32", batch, True)
        bf16_compute, bf16_bw = roof("bf16", batch, True)
        ours32 = decode_tokens_per_cpu_s(ours_cpu_seconds, policy, prompts, batch, args.steps, torch.float32)
        ours16 = decode_tokens_per_cpu_s(ours_cpu_seconds, policy, prompts, batch, args.steps, torch.bfloat16)
        fp32_roof, bf16_roof = min(fp32_compute, fp32_bw), min(bf16_compute, bf16_bw)
        row = [str(batch), f"{fp32_compute:.0f} / {fp32_bw:.0f}", f"{ours32:.1f}", f"{100 * ours32 / fp32_roof:.0f}%",
               f"{bf16_compute:.0f} / {bf16_bw:.0f}", f"{ours16:.1f}", f"{100 * ours16 / bf16_roof:.0f}%",
               f"{100 * ours16 / fp32_roof:.0f}%"]
        if args.hf:
            hf_roof = min(roof("fp32", batch, False)[0], fp32_bw)
            hf = decode_tokens_per_cpu_s(hf_cpu_seconds, policy, prompts, batch, args.steps, torch.float32)
            row += [f"{hf_roof:.0f}", f"{hf:.1f}", f"{100 * hf / hf_roof:.0f}%"]
        table.append(row)
        print(f"  B={batch} done, load average {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    print_rows(table)

    # 4. a real round
    for name in ("fp32", "bf16"):
        policy.generation_bf16 = name == "bf16"
        tokens, seconds = real_round(policy, prompts, args.steps)
        print(f"real round, sample_completions 4 x 8 up to {args.steps} tokens with early stops, {name}: {tokens} tokens "
              f"in {seconds:.2f} CPU s = {tokens / seconds:.1f} tokens per CPU second (prefill, weight packing and "
              f"the shrinking batch included)")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
