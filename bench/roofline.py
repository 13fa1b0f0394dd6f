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
   lm_head, and the stacked q|k|v and gate|up that training/decoder/decoding.py multiplies by), at
   B = 1, 8, 32, 64, fp32 and bf16, with the weights streamed from memory as in a real step
   (enough distinct copies to overflow the caches); for F.linear (what transformers uses) and
   for oneDNN with weights packed once (what LlamaDecoder uses);
2. copy bandwidth (bench/bandwidth.py) and each shape's share of a token's FLOPs;
3. decoding tokens per CPU second at each B against the roofline, for LlamaDecoder in fp32
   and bf16 (decode_samples) and for transformers' `generate` (fp32): every row runs the full
   `--steps` (no EOS), and the prefill is taken out by subtracting a 1-token run;
4. one real `sample_completions` round (4 prompts x 8 samples, early stops), end to end.

    .venv/bin/python -m bench.roofline                       # smollm2-135m, about 5 minutes
    .venv/bin/python -m bench.roofline --batches 8,32 --no-hf
    .venv/bin/python -m bench.roofline --smoke               # tiny, seconds
    python -m bench.roofline --device cuda --batches 32,256  # on a GPU (bench/gpu_check.py)

On a GPU (`--device cuda`) every time is wall time after a synchronize, the matmuls are cuBLAS's
(no oneDNN packing), `generate` runs on a bf16 copy of the model, and the card's own roof is
printed beside the per-shape one: the FLOPs of a token at the rate of one large bf16 matrix
product (8192 x 8192 x 8192, mean of 10 after 3 warm-ups), and the bandwidth bound at the
device's copy bandwidth. At a small model's batch the per-shape rates already include each
kernel's launch, which is what a decoding step pays too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.bandwidth import DecodeGeometry, copy_bandwidth_gbs, decode_bound_tokens_per_s
from bench.matmul_rate import Clock, kernels_on, matmul_gflops, peak_matmul_tflops, streamed_weights
from bench.roofline_decode import decode_tokens_per_s, hf_seconds, ours_seconds, real_round
from bench.text_table import print_rows

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


# --- the report ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="smollm2-135m", help="model name (a tiny variant, smollm2-135m, a local HF directory)"
    )
    parser.add_argument("--batches", default="1,8,32,64", help="decode batch sizes")
    parser.add_argument("--steps", type=int, default=48, help="decoding steps per row in the decode measurements")
    parser.add_argument("--matmul-seconds", type=float, default=0.15, help="about how long each matmul rate is timed")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: what a node sharing its CPU uses)")
    parser.add_argument(
        "--hf", action=argparse.BooleanOptionalAction, default=True, help="also time transformers' generate (fp32)"
    )
    parser.add_argument(
        "--stream-mb",
        type=float,
        default=96,
        help="bytes of distinct weight copies each matmul cycles through (above the L3 size: 32 MB here)",
    )
    parser.add_argument("--bandwidth-mb", type=float, default=256, help="size of the copy that measures bandwidth")
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR, help="converted-model cache")
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda / cuda:N: wall time after a synchronize, cuBLAS, the card's roof"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write one JSON row per batch size here")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model, batches 1 and 8, few steps: a quick check it runs"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.batches, args.steps, args.matmul_seconds, args.bandwidth_mb = "tiny", "1,8", 4, 0.01, 16
        args.stream_mb = 2
    args.batch_list = [int(b) for b in args.batches.split(",") if b.strip()]
    if args.steps < 2 or not args.batch_list or min(args.batch_list) < 1:
        parser.error("--steps must be >= 2 and --batches positive")
    return args


def cpu_flags() -> str:
    flags = [
        name
        for name, probe in (
            ("avx512", "_is_avx512_supported"),
            ("avx512_bf16", "_is_avx512_bf16_supported"),
            ("amx", "_is_amx_tile_supported"),
        )
        if getattr(torch.cpu, probe, lambda: False)()
    ]
    return ", ".join(flags) or "no AVX-512"


@dataclass
class Roof:
    """What bounds a decoding step at batch B: the measured rate of each shape, and the bytes a step reads."""

    linears: list[Linear]
    rates: dict[tuple[str, str, int, str], float]  # (out x in, dtype, batch, kernel) -> GFLOPS
    kernels: tuple[str, ...]
    geometry: DecodeGeometry
    context: float
    bandwidth: float

    def bandwidth_bound(self, dtype_name: str, batch: int) -> float:
        scale = 0.5 if dtype_name == "bf16" else 1.0
        bytes_geometry = DecodeGeometry(
            int(self.geometry.weight_bytes * scale), int(self.geometry.kv_bytes_per_token * scale)
        )
        return decode_bound_tokens_per_s(bytes_geometry, batch, self.context, self.bandwidth)

    def __call__(self, dtype_name: str, batch: int, decoder: bool) -> tuple[float, float]:
        """(compute bound, bandwidth bound): LlamaDecoder's shapes at its best kernel, or the model's own at F.linear."""
        used = [lin for lin in self.linears if (lin.decoder if decoder else lin not in self.linears[-2:])]
        seconds = sum(
            lin.flops(batch)
            / 1e9
            / max(
                self.rates[(f"{lin.out}x{lin.inp}", dtype_name, batch, kernel)]
                for kernel in (self.kernels if decoder else ("F.linear",))
            )
            for lin in used
        )
        return batch / seconds, self.bandwidth_bound(dtype_name, batch)


def measure_matmuls(
    args: argparse.Namespace, linears: list[Linear], device: torch.device, clock: Clock, kernels: tuple[str, ...]
) -> dict[tuple[str, str, int, str], float]:
    """1. The matmul rate of every distinct shape, dtype, batch and kernel, printed as a table."""
    rates: dict[tuple[str, str, int, str], float] = {}
    rows = [["shape", "out x in", "dtype"] + [f"B={b} {' / '.join(kernels)}" for b in args.batch_list]]
    distinct = {}
    for linear in linears:
        distinct.setdefault((linear.out, linear.inp), linear.name)
    for (out, inp), name in distinct.items():
        for dtype_name, dtype in DTYPES.items():
            cells = []
            weights = streamed_weights(out, inp, dtype, args.stream_mb * 2**20, device)
            for b in args.batch_list:
                for kernel in kernels:
                    rates[(f"{out}x{inp}", dtype_name, b, kernel)] = matmul_gflops(
                        weights, b, kernel, args.matmul_seconds, clock
                    )
                cells.append(" / ".join(f"{rates[(f'{out}x{inp}', dtype_name, b, k)]:.0f}" for k in kernels))
            rows.append([name, f"{out} x {inp}", dtype_name] + cells)
            del weights
    print()
    print(
        "matmul GFLOPS, weights streamed from memory ("
        + (
            "F.linear / oneDNN with the weight packed once"
            if len(kernels) > 1
            else "F.linear, each call launched alone"
        )
        + ")"
    )
    print_rows(rows)
    return rates


def print_flops_and_bandwidth(
    args: argparse.Namespace, policy, linears: list[Linear], device: torch.device, clock: Clock
) -> tuple[float, float, DecodeGeometry, float | None]:
    """2. Each shape's share of a token's FLOPs, and the copy bandwidth: (FLOPs per token, GB/s, geometry, card TFLOP/s)."""
    model_own = [lin for lin in linears if lin.name not in ("q|k|v", "gate|up")]
    total = sum(lin.flops(1) for lin in model_own)
    print()
    print(
        f"FLOPs per token in linear layers: {total / 1e6:.1f} M (2 x {total / 2e6:.1f} M weights); share: "
        + ", ".join(f"{lin.name} {100 * lin.flops(1) / total:.1f}%" for lin in model_own)
    )
    bandwidth = copy_bandwidth_gbs(args.bandwidth_mb, repeats=3, threads=args.threads, device=str(device))
    geometry = DecodeGeometry.of(policy.model)
    peak_tflops = peak_matmul_tflops(device) if clock.gpu else None
    print(
        f"copy bandwidth: {bandwidth:.1f} GB/s; weights {geometry.weight_bytes / 1e6:.0f} MB in fp32; "
        f"KV cache {geometry.kv_bytes_per_token / 1e3:.1f} kB per token in fp32"
        + (f"; bf16 matmul 8192^3: {peak_tflops:.0f} TFLOP/s" if peak_tflops else "")
    )
    return total, bandwidth, geometry, peak_tflops


def decode_header(args: argparse.Namespace, clock: Clock, prompt_tokens: int, hf_dtype: str) -> list[str]:
    per = "second" if clock.gpu else "CPU second"
    print()
    print(
        f"decoding, tokens per {per} ({args.steps} steps per row, prefill excluded; context {prompt_tokens} "
        f"prompt + {args.steps // 2} mean generated tokens). roof = min(compute bound at the best measured kernel "
        f"per shape, bandwidth bound); 'F.linear roof' = compute bound with F.linear alone (what generate multiplies with)"
        + ("; card roof = min(token FLOPs at the 8192^3 bf16 rate, bf16 bandwidth bound)" if clock.gpu else "")
    )
    header = [
        "B",
        "fp32 compute / bandwidth roof",
        "ours fp32",
        "% of roof",
        "bf16 compute / bandwidth roof",
        "ours bf16",
        "% of roof",
        "% of fp32 roof",
    ]
    if clock.gpu:
        header += ["card bf16 roof", "ours bf16 % of it"]
    if args.hf:
        header += [f"F.linear {hf_dtype} roof", f"generate {hf_dtype}", "% of it"]
    return header


def decode_row(
    args: argparse.Namespace,
    policy,
    prompts: list[str],
    batch: int,
    roof: Roof,
    clock: Clock,
    hf_model,
    hf_dtype: str,
    card_flops: tuple[float | None, float],
) -> tuple[list[str], dict]:
    """3. One batch size: ours in fp32 and bf16 (and generate) against the roof, as a table row and a record."""
    fp32_compute, fp32_bw = roof("fp32", batch, True)
    bf16_compute, bf16_bw = roof("bf16", batch, True)

    def ours(dtype):
        return lambda b, steps: ours_seconds(policy, prompts, b, steps, dtype, clock)

    ours32 = decode_tokens_per_s(ours(torch.float32), batch, args.steps)
    ours16 = decode_tokens_per_s(ours(torch.bfloat16), batch, args.steps)
    fp32_roof, bf16_roof = min(fp32_compute, fp32_bw), min(bf16_compute, bf16_bw)
    row = [
        str(batch),
        f"{fp32_compute:.0f} / {fp32_bw:.0f}",
        f"{ours32:.1f}",
        f"{100 * ours32 / fp32_roof:.0f}%",
        f"{bf16_compute:.0f} / {bf16_bw:.0f}",
        f"{ours16:.1f}",
        f"{100 * ours16 / bf16_roof:.0f}%",
        f"{100 * ours16 / fp32_roof:.0f}%",
    ]
    peak_tflops, total = card_flops
    record = {
        "model": args.model,
        "device": str(policy.device),
        "batch": batch,
        "steps": args.steps,
        "context": roof.context,
        "unit": f"tokens per {'second' if clock.gpu else 'CPU second'}",
        "bandwidth_gbs": roof.bandwidth,
        "peak_bf16_tflops": peak_tflops,
        "fp32_roof": fp32_roof,
        "fp32_compute_roof": fp32_compute,
        "fp32_bandwidth_roof": fp32_bw,
        "ours_fp32": ours32,
        "bf16_roof": bf16_roof,
        "bf16_compute_roof": bf16_compute,
        "bf16_bandwidth_roof": bf16_bw,
        "ours_bf16": ours16,
    }
    if clock.gpu:
        card = min(peak_tflops * 1e12 / total, bf16_bw)
        row += [f"{card:.0f}", f"{100 * ours16 / card:.1f}%"]
        record |= {"card_bf16_roof": card, "card_bf16_compute_roof": peak_tflops * 1e12 / total}
    if args.hf:
        hf_roof = min(roof(hf_dtype, batch, False)[0], roof.bandwidth_bound(hf_dtype, batch))
        hf = decode_tokens_per_s(
            lambda b, steps: hf_seconds(hf_model, policy.tokenizer, prompts, b, steps, DTYPES[hf_dtype], clock),
            batch,
            args.steps,
        )
        row += [f"{hf_roof:.0f}", f"{hf:.1f}", f"{100 * hf / hf_roof:.0f}%"]
        record |= {"hf_dtype": hf_dtype, "hf_roof": hf_roof, "hf_generate": hf}
    return row, record


def real_rounds(args: argparse.Namespace, policy, prompts: list[str], clock: Clock) -> list[dict]:
    """4. One real round in each generation precision."""
    per = "second" if clock.gpu else "CPU second"
    records = []
    for name in ("fp32", "bf16"):
        policy.generation_bf16 = name == "bf16"
        tokens, seconds = real_round(policy, prompts, args.steps, clock)
        print(
            f"real round, sample_completions 4 x 8 up to {args.steps} tokens with early stops, {name}: {tokens} tokens "
            f"in {seconds:.2f} {clock.unit} = {tokens / seconds:.1f} tokens per {per} (prefill, weight packing and "
            f"the shrinking batch included)"
        )
        records.append(
            {
                "model": args.model,
                "device": str(policy.device),
                "real_round": name,
                "tokens": tokens,
                "seconds": seconds,
                "unit": clock.unit,
            }
        )
    return records


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from sapo.training.models.devices import resolve_device
    from sapo.training.models.policy import load_policy
    from sapo.training.problems.tasks import TaskSampler, default_task_specs

    device = resolve_device(args.device)
    clock, kernels = Clock(device), kernels_on(device)
    args.models_dir.mkdir(parents=True, exist_ok=True)
    policy = load_policy(
        args.model, device=str(device), seed=0, models_dir=args.models_dir, generation_precision="fp32"
    )
    linears = model_linears(policy.model.config)
    where = f"{torch.cuda.get_device_name(device)}, wall clock after a synchronize" if clock.gpu else "CPU clock"
    print(
        f"roofline of decoding {args.model} on {device}: torch {torch.__version__}, {args.threads} thread(s), {where}"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs ({cpu_flags()}), python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f} at the start (CONTENDED when above about 0.5)"
    )
    rates = measure_matmuls(args, linears, device, clock, kernels)
    total, bandwidth, geometry, peak_tflops = print_flops_and_bandwidth(args, policy, linears, device, clock)

    tasks = TaskSampler(default_task_specs(["basic_arithmetic"]), dataset_seed=0, rng_seed=0)
    prompts = [policy.prompt(p) for p in tasks.sample(4)]
    prompt_tokens = max(len(ids) for ids in policy.tokenizer(prompts, add_special_tokens=False)["input_ids"])
    roof = Roof(linears, rates, kernels, geometry, prompt_tokens + args.steps / 2, bandwidth)
    # generate: fp32 on a CPU (bf16 is emulated on most), a bf16 copy of the model on a GPU
    hf_dtype = "bf16" if clock.gpu else "fp32"
    hf_model = None
    if args.hf:  # a copy: the policy stays fp32 for our decoder, which makes its own bf16 weights
        import copy

        hf_model = copy.deepcopy(policy.model).to(DTYPES[hf_dtype]) if clock.gpu else policy.model
    table, records = [decode_header(args, clock, prompt_tokens, hf_dtype)], []
    for batch in args.batch_list:
        row, record = decode_row(args, policy, prompts, batch, roof, clock, hf_model, hf_dtype, (peak_tflops, total))
        table.append(row)
        records.append(record)
        print(f"  B={batch} done, load average {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    print_rows(table)
    records += real_rounds(args, policy, prompts, clock)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        args.json.write_text("".join(json.dumps(r) + "\n" for r in records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
