"""The round benchmark's report (bench/round.py): the tables, sapo against each peer, and the bounds."""

from __future__ import annotations

import argparse
import os
import platform

from bench.bandwidth import DecodeGeometry, decode_bound_tokens_per_s
from bench.round_sapo import TASK
from bench.text_table import print_rows

# (header, format) of each column of the two tables: times, then the details beside them
TIME_COLUMNS = [
    ("model", "{model}"),
    ("framework", "{framework}"),
    ("generate s", "{generate_s:.2f}"),
    ("score s", "{score_s:.3f}"),
    ("enc+update s", "{update_s:.2f}"),
    ("total s", "{total_s:.2f}"),
    ("generate CPU s", "{generate_cpu_s:.2f}"),
    ("enc+update CPU s", "{update_cpu_s:.2f}"),
    ("total CPU s", "{total_cpu_s:.2f}"),
    ("opt steps", "{optimizer_steps}"),
    ("skipped", "{skipped}"),
]
DETAIL_COLUMNS = [
    ("model", "{model}"),
    ("framework", "{framework}"),
    ("params", "{parameters_m}"),
    ("load s", "{load_s:.1f}"),
    ("tokens", "{tokens:.0f}"),
    ("tok/s", "{tokens_per_s:.1f}"),
    ("tok/CPU s", "{tokens_per_cpu_s:.1f}"),
    ("decode batch", "{decode_batch}"),
    ("bound tok/s", "{bound_tokens_per_s:.0f}"),
    ("of bound", "{of_bound_pct}"),
    ("of bound (CPU)", "{of_bound_cpu_pct}"),
    ("peak RSS MB (load)", "{load_peak}"),
    ("peak RSS MB (round)", "{round_peak_rss_mb:.0f}"),
    ("reward", "{real_reward_mean:.3f}"),
]


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def add_decode_bound(row: dict, sapo: dict, bandwidth_gbs: float) -> None:
    """The memory-bound decoding limit for the row's own decode batch."""
    geometry = DecodeGeometry(**sapo["geometry"])  # same model and LoRA in every framework
    row["bound_tokens_per_s"] = decode_bound_tokens_per_s(
        geometry, row["decode_batch"], sapo["decode_context"], bandwidth_gbs
    )


def print_table(
    args: argparse.Namespace, results: list[dict], missing: list[tuple[str, str, str]], bandwidth_gbs: float
) -> None:
    print_header(args, results, bandwidth_gbs)
    fields = [
        {
            **r,
            "parameters_m": f"{r['parameters'] / 1e6:.1f}M",
            "of_bound_pct": f"{100 * r['tokens_per_s'] / r['bound_tokens_per_s']:.1f}%",
            "of_bound_cpu_pct": f"{100 * r['tokens_per_cpu_s'] / r['bound_tokens_per_s']:.1f}%",
            "load_peak": f"{r['load_peak_rss_mb']:.0f}" if "load_peak_rss_mb" in r else "-",
            "skipped": r.get("skipped_updates", "-"),
        }
        for r in results
    ]
    for columns in (TIME_COLUMNS, DETAIL_COLUMNS):
        print()
        print_rows([[h for h, _ in columns]] + [[fmt.format(**f) for _, fmt in columns] for f in fields])
    if results and not all(r["peak_is_round_only"] for r in results):
        print("note: this OS cannot reset the peak RSS; 'round' peak includes loading")
    if any(r["model"].startswith("tiny") for r in results):
        print("note: a tiny model's weights fit in the CPU caches, so its bandwidth bound means little")
    print_ratios(results)
    print_bounds(results)
    print()
    print_versions(results, missing)


def print_header(args: argparse.Namespace, results: list[dict], bandwidth_gbs: float) -> None:
    print()
    print(
        f"GRPO round benchmark: {args.questions} questions x {args.generations} generations, "
        f"max_new_tokens={args.max_new_tokens}, task={TASK} (easy), "
        f"{'LoRA r=16' if args.lora else 'full fine-tuning'}, torch threads={args.threads}, seed={args.seed}"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"load average {args.load_at_start:.2f} at the start, {load_average():.2f} at the end. Wall times are "
        f"CONTENDED when other jobs share the CPUs (the load average says how much); CPU s is the process's CPU "
        f"time (all its threads), the steadier figure: with 1 thread, about what the step takes on a quiet core."
    )
    timed = results[0]["timed_rounds"] if results else 0
    print(
        f"times are the mean of {timed} timed round(s)"
        f"{' after 1 warm-up round' if args.rounds > 1 else ' (no warm-up)'}; load time is not in the round."
        + (" Flat-reward groups got forced 0/1 rewards (--force-signal)." if args.force_signal else "")
    )
    print(
        f"memory bandwidth (torch copy{'' if args.device == 'cpu' else ' on ' + args.device}, "
        f"{args.threads} thread{'s' if args.threads > 1 else ''}): "
        f"{bandwidth_gbs:.1f} GB/s; 'bound tok/s' = decode batch x bandwidth / (weights + batch x KV per token x "
        f"context), context = padded prompt + max_new_tokens/2 (bench/bandwidth.py)"
    )


def print_versions(results: list[dict], missing: list[tuple[str, str, str]]) -> None:
    """Each framework's versions, each missing peer's reason, and the plain-generate and GPU lines."""
    for framework in dict.fromkeys(r["framework"] for r in results):
        ran = [r for r in results if r["framework"] == framework]
        # a peer's update that leaves its trainable weights as they were is a broken update
        changed = ", ".join(
            f"{r['model']} {'yes' if r['weights_changed'] else 'NO'}" for r in ran if "weights_changed" in r
        )
        print(
            f"{framework}: {ran[0]['version']}"
            + (f"; update changed the trainable weights: {changed}" if changed else "")
        )
    for peer, model, reason in missing:
        print(f"{peer} ({model}) has no row: {reason}")
    for r in results:
        if r.get("hf_generate"):
            hf = r["hf_generate"]
            print(
                f"{r['model']} on {r['device']}: plain transformers generate ({hf['dtype']}, merged weights) of the last "
                f"round's {hf['rows']} rows: {hf['tokens']} tokens in {hf['seconds']:.2f} s = {hf['tokens_per_s']:.0f} "
                f"tok/s; sapo's generate step: {r['tokens']:.0f} tokens in {r['generate_s']:.2f} s = "
                f"{r['tokens_per_s']:.0f} tok/s ({r['tokens_per_s'] / hf['tokens_per_s']:.2f}x HF's tok/s)"
            )
        if r.get("gpu_peak_mb"):
            print(f"{r['model']} on {r['device']}: peak GPU memory allocated {r['gpu_peak_mb']:.0f} MB")


def print_ratios(results: list[dict]) -> None:
    """sapo's seconds over each peer's, per model and step: below 1, sapo is faster."""
    keys = ("total_s", "total_cpu_s", "generate_s", "generate_cpu_s", "update_s", "update_cpu_s")
    rows = [["model", "ratio", "total", "total CPU", "generate", "generate CPU", "enc+update", "enc+update CPU"]]
    for r in results:
        if r["framework"] == "sapo":
            continue
        sapo = next(s for s in results if s["framework"] == "sapo" and s["model"] == r["model"])
        rows.append(
            [r["model"], f"sapo/{r['framework']}"] + [f"{sapo[k] / r[k]:.2f}" if r[k] > 0 else "-" for k in keys]
        )
    if len(rows) == 1:
        return
    print()
    print("seconds per round, sapo / peer (below 1: sapo is faster)")
    print_rows(rows)


def print_bounds(results: list[dict]) -> None:
    """sapo's update against its compute bound at each precision (bench/update_bound.py)."""
    rows = [
        [
            "model",
            "update precision",
            "update CPU s",
            "TFLOP",
            "fp32 bound s",
            "of fp32 bound",
            "bf16 bound s",
            "of bf16 bound",
        ]
    ]
    for r in results:
        bound = r.get("update_bound")
        if r["framework"] != "sapo" or not bound or r["update_cpu_s"] <= 0:
            continue
        cells = [r["model"], r["update_precision"], f"{r['update_cpu_s']:.2f}", f"{bound['tflop']:.3f}"]
        for dtype in ("fp32", "bf16"):
            seconds = bound["seconds"][dtype]
            cells += [
                f"{seconds:.2f} ({bound['gflops'][dtype]:.0f} GFLOPS)",
                f"{100 * seconds / r['update_cpu_s']:.0f}%",
            ]
        rows.append(cells)
    if len(rows) == 1:
        return
    print()
    print(
        "sapo's update against its compute bound: the matmul FLOPs of its forward and input-gradient passes over "
        "its tokens (each group's prompt once a pass, lm_head on completion tokens; bench/update_bound.py) at the "
        "fp32 and bf16 rates this thread measured at 256 rows (best of F.linear and oneDNN packed); "
        "'of bound' = bound s / update CPU s"
    )
    print_rows(rows)
