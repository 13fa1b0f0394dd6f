"""Memory bandwidth, and the fastest decoding it allows.

Decoding one token for a batch of B sequences reads every weight once and each sequence's KV
cache once, and does little arithmetic per byte read. So, at best,

    seconds per step  = (weight bytes + B x KV bytes per token x context) / bandwidth
    tokens per second = B / seconds per step

Memory bandwidth is measured with a copy (as STREAM "copy" does): `dst.copy_(src)` of two
large fp32 tensors, counted as 2 x size bytes moved (read src + write dst), best of
`--repeats`. With `--threads 1` that is what one node using one torch thread can draw; it is
then timed on the process's CPU clock, so a busy machine does not hide it (much).

    .venv/bin/python -m bench.bandwidth                            # copy bandwidth, decode bounds
    .venv/bin/python -m bench.bandwidth --models smollm2-135m --context 256
    .venv/bin/python -m bench.bandwidth --smoke

A model whose weights fit in the CPU caches (the tiny ones, about 5 MB) is not bounded by
memory at all: its bound is printed but means little; there the limit is per-step overhead.
bench/round.py prints each framework's generation tokens/s against this bound.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODELS_DIR = Path(__file__).resolve().parent / ".cache" / "models"


@dataclass(frozen=True)
class DecodeGeometry:
    """What one decoding step must read: every weight, and per token of context its KV entries."""

    weight_bytes: int
    kv_bytes_per_token: int  # per sequence, all layers, keys and values

    @classmethod
    def of(cls, model) -> DecodeGeometry:
        """From a torch causal LM (or a PEFT wrapper: an unmerged LoRA's weights are read too)."""
        config = model.config
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        dtype_bytes = next(model.parameters()).element_size()
        return cls(
            weight_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
            kv_bytes_per_token=2 * config.num_hidden_layers * kv_heads * head_dim * dtype_bytes,
        )


def decode_bound_tokens_per_s(geometry: DecodeGeometry, batch: int, context: float, bandwidth_gbs: float) -> float:
    """The most tokens/s a memory-bound decoder can produce for `batch` sequences at `context` tokens."""
    step_bytes = geometry.weight_bytes + batch * geometry.kv_bytes_per_token * context
    return batch * bandwidth_gbs * 1e9 / step_bytes


def copy_bandwidth_gbs(size_mb: float = 256, repeats: int = 5, threads: int = 1, device: str = "cpu") -> float:
    """Best-of-`repeats` GB/s of `dst.copy_(src)` on two `size_mb` fp32 tensors (2 x size moved).

    With one thread the copy is timed on the process's CPU clock, so time spent descheduled on
    a busy machine does not count (other jobs' memory traffic still does); with more, by wall clock.
    On a GPU (`device` cuda...) it is the device's memory, timed by wall clock after a synchronize.
    """
    import torch

    on_gpu = torch.device(device).type == "cuda"
    clock = time.process_time if threads == 1 and not on_gpu else time.perf_counter

    def synchronize() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.ones(int(size_mb * 2**20) // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)  # fault every page in before timing
        synchronize()
        best = float("inf")
        for _ in range(repeats):
            started = clock()
            dst.copy_(src)
            synchronize()
            best = min(best, clock() - started)
        return 2 * src.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(previous)


def model_geometry(name: str, models_dir: Path, seed: int = 0) -> DecodeGeometry:
    """The geometry of a named model (a tiny variant, smollm2-135m, or a local HF directory), no LoRA."""
    from sapo.training.models.policy import load_policy

    return DecodeGeometry.of(load_policy(name, device="cpu", seed=seed, models_dir=models_dir).model)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=512, help="size of each of the two copied tensors")
    parser.add_argument("--repeats", type=int, default=5, help="copies timed; the best one counts")
    parser.add_argument("--threads", default="1,all", help="comma-separated torch thread counts ('all' = every CPU)")
    parser.add_argument(
        "--models", default="tiny,smollm2-135m", help="models to compute decode bounds for ('' for none)"
    )
    parser.add_argument("--batches", default="1,4,8,32", help="batch sizes of the decode bound table")
    parser.add_argument(
        "--context", type=float, default=150, help="context tokens per sequence (prompt + half the completion)"
    )
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR, help="converted-model cache")
    parser.add_argument(
        "--smoke", action="store_true", help="64 MB, 2 repeats, tiny only: a quick check that this runs"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.size_mb, args.repeats, args.models = 64, 2, "tiny"
    if args.size_mb <= 0 or args.repeats < 1 or args.context < 0:
        parser.error("--size-mb and --repeats must be positive and --context >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cpus = os.cpu_count() or 1
    threads = [cpus if t.strip() == "all" else int(t) for t in args.threads.split(",") if t.strip()]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"memory bandwidth: torch copy of 2 x {args.size_mb:g} MB fp32, best of {args.repeats}")
    print(f"machine: {platform.machine()}, {cpus} CPUs, load average {load:.2f} (CONTENDED when > 0.5)")
    measured = {}
    for n in dict.fromkeys(threads):
        measured[n] = copy_bandwidth_gbs(args.size_mb, args.repeats, n)
        print(f"copy bandwidth, {n} thread{'s' if n > 1 else ''}: {measured[n]:.1f} GB/s")
    bandwidth = measured[threads[0]]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        return 0
    batches = [int(b) for b in args.batches.split(",")]
    print()
    print(
        f"decode bound at {bandwidth:.1f} GB/s ({threads[0]} thread{'s' if threads[0] > 1 else ''}), "
        f"context {args.context:g} tokens, fp32: tokens/s = B x bandwidth / (weights + B x KV/token x context)"
    )
    header = ["model", "weights MB", "KV KB/token"] + [f"B={b} tok/s" for b in batches]
    rows = [header]
    for name in models:
        g = model_geometry(name, args.models_dir)
        rows.append(
            [name, f"{g.weight_bytes / 1e6:.1f}", f"{g.kv_bytes_per_token / 1e3:.1f}"]
            + [f"{decode_bound_tokens_per_s(g, b, args.context, bandwidth):,.0f}" for b in batches]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for n, row in enumerate(rows):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
