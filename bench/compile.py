"""Does torch.compile pay for itself within a round? Decoding with and without it, on one CPU thread.

A node rebuilds its decoder every round (the weights change), decodes a few hundred to a few
thousand tokens, and its batch shrinks as rows stop, so a compiled decode step has to earn back
its compile time, and every recompile, out of a round's worth of tokens. Measured here, on one
torch thread and on the CPU clock (the process and the compiler's gcc children, so that other
jobs on the machine hide little; the load average says how much they could), each variant
against the uncompiled path it replaces:

- `layer/F.linear`: one decoder layer's step compiled with inductor (the same code for all
  layers, so one graph serves them all), plain weights multiplied by F.linear, against
  LlamaDecoder as decode_samples runs it (oneDNN-packed weights). The packed weights cannot go
  to inductor as LlamaDecoder has them: its lowering of mkldnn._linear_pointwise asserts that
  the weight is a frozen constant, and freezing (which would pack the weights itself) bakes
  them into the compiled code, which would then recompile every round, when the weights change;
- `layer/oneDNN op`: the same, with LlamaDecoder's packed matmul wrapped in a custom op that
  inductor calls as an opaque kernel, so that it fuses only what lies between the matmuls;
- `step/...`: the whole step (all layers) as one graph, the same two ways (not in the default
  set: it compiles every layer's code);
- `hf static`: transformers' documented route, a static cache and `model.forward =
  torch.compile(model.forward)`, timing `generate` (which keeps every row to the end and
  multiplies with F.linear), against uncompiled `generate` with the same static cache.

The compiled step is LlamaDecoder.step with one change (CompiledDecoder, in bench/compiled_decoder.py): the column a
token is written to goes in as a tensor (index_copy_), because dynamo specializes on the
Python int cache.column and so recompiles the original at every step.

The workload: two real rounds (`--round-prompts` x `--round-samples` up to `--round-tokens`,
stopping at EOS and </answer>, so the batch shrinks; two question sets, so the prompt length
changes) and fixed batches of B = 8 and 32 rows for `--steps` tokens (no EOS) and for 1 token
(so that the prefill is taken out, as bench/roofline.py does); `hf static` runs the fixed
batches only. Each variant runs it once cold, then `--repeats` times warm, each warm pass
followed by an uncompiled one (so that the two see the same load). Compile cost = the cold
pass minus the best warm one; the rates are the best of the warm (and of the uncompiled)
passes. Each variant starts with an empty inductor cache (fresh_cache: a new cache directory,
in-memory caches cleared), so its compile is what a freshly started node pays; inductor compiles
in this process (compile_threads = 1), so its gcc calls are waited-for children, counted.
Break-even = compile CPU seconds / CPU seconds saved per token at the rounds' rate.

    .venv/bin/python bench/compile.py                          # smollm2-135m: ~12 CPU minutes, most of it compiling
    .venv/bin/python bench/compile.py --variants "layer/oneDNN op" --dtypes bf16,fp32
    .venv/bin/python bench/compile.py --variants "layer/F.linear" --modes default,max-autotune-no-cudagraphs
    .venv/bin/python bench/compile.py --smoke                  # tiny, dynamo with its eager backend, ~15 s
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch._dynamo
from compiled_decoder import compiled
from matmul_rate import Clock
from roofline import DEFAULT_MODELS_DIR, DTYPES
from roofline_decode import decode_fixed, hf_seconds
from text_table import print_rows
from torch._dynamo.utils import counters

VARIANTS = ("layer/F.linear", "layer/oneDNN op", "step/F.linear", "step/oneDNN op", "hf static")
DEFAULT_VARIANTS = "layer/F.linear,layer/oneDNN op,hf static"


def cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (inductor's gcc runs)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# --- the workload -----------------------------------------------------------------------------------


def round_tokens(policy, prompts: list[str], samples: int, max_new_tokens: int, dtype) -> tuple[int, list]:
    """One real round's decoding: EOS and </answer> stop rows, so the batch shrinks."""
    from sapo.training.decoding import decode_samples
    from sapo.training.generation import ANSWER_CLOSE

    decoded = decode_samples(
        policy.model,
        policy.tokenizer,
        prompts,
        samples_per_prompt=samples,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        seed=0,
        device=policy.device,
        stop_text=ANSWER_CLOSE,
        weights_dtype=dtype,
    )
    return decoded.new_tokens, decoded.token_ids


def fixed_batch(policy, prompts: list[str], batch: int, steps: int, dtype) -> tuple[int, list]:
    """B rows decoding `steps` tokens each, no EOS (bench/roofline.py's layout of the rows)."""
    decode_fixed(policy, prompts, batch, steps, dtype)
    return batch * steps, []


def static_generate(policy, prompts: list[str], batch: int, steps: int, dtype) -> tuple[int, list]:
    """transformers' generate with a static cache, B rows for `steps` tokens (roofline.py's call)."""
    policy.model.generation_config.cache_implementation = "static"
    try:
        hf_seconds(policy.model, policy.tokenizer, prompts, batch, steps, dtype, Clock(policy.device))
    finally:
        policy.model.generation_config.cache_implementation = None
    return batch * steps, []


@dataclass
class Item:
    name: str
    run: object  # () -> (tokens, token ids)


def workload(variant: str, policy, rounds: list[list[str]], args, dtype) -> list[Item]:
    items = []
    if variant.startswith("hf"):
        measure = static_generate
    else:
        measure = fixed_batch
        items += [
            Item(f"round {i}", lambda p=p: round_tokens(policy, p, args.round_samples, args.round_tokens, dtype))
            for i, p in enumerate(rounds)
        ]
    for b in args.batch_list:
        for steps in (args.steps, 1):
            items.append(Item(f"B={b} x {steps}", lambda b=b, s=steps: measure(policy, rounds[0], b, s, dtype)))
    return items


@dataclass
class Result:
    variant: str
    dtype: str
    mode: str
    compile_cpu: float
    compile_wall: float
    graphs: int
    graph_breaks: int
    later_graphs: int  # graphs compiled after the first pass (0 when the first pass saw every shape)
    rates: dict  # "B=8", "B=32", "round" -> tokens per CPU second, compiled
    plain: dict  # the same, uncompiled, measured between the compiled passes
    round_tokens: float  # tokens per measured round
    same_rows: str  # rows of the rounds whose tokens are the uncompiled decoder's


def run_pass(items: list[Item]) -> list[tuple[float, float, int, list]]:
    """(CPU s, wall s, tokens, token ids) of each item."""
    times = []
    for item in items:
        cpu, wall = cpu_seconds(), time.time()
        tokens, ids = item.run()
        times.append((cpu_seconds() - cpu, time.time() - wall, tokens, ids))
    return times


def rates_of(passes: list[list[tuple]], items: list[Item], args) -> tuple[dict, float]:
    """Tokens per CPU second of each fixed batch (prefill taken out) and of the rounds, from the
    best of `passes` per item; and the tokens of one round."""
    best = {item.name: (min(p[i][0] for p in passes), passes[0][i][2]) for i, item in enumerate(items)}
    rates = {}
    for b in args.batch_list:
        full, first = best[f"B={b} x {args.steps}"][0], best[f"B={b} x 1"][0]
        rates[f"B={b}"] = b * (args.steps - 1) / max(full - first, 1e-9)
    rounds = [name for name in best if name.startswith("round")]
    if not rounds:
        return rates, 0.0
    tokens = sum(best[name][1] for name in rounds)
    rates["round"] = tokens / sum(best[name][0] for name in rounds)
    return rates, tokens / len(rounds)


def measure(variant: str, dtype_name: str, mode: str, policy, rounds: list[list[str]], args) -> Result:
    """The workload compiled (one cold pass, then `--repeats` warm ones), each warm pass followed
    by an uncompiled one, so that the two see the same load on the machine."""
    from torch._inductor.utils import fresh_cache

    dtype = DTYPES[dtype_name]
    torch._dynamo.reset()
    counters.clear()
    kwargs = {"backend": args.backend, **({"mode": mode} if args.backend == "inductor" and mode != "default" else {})}
    items = workload(variant, policy, rounds, args, dtype)
    label = f"{variant} {dtype_name} {mode}"
    with fresh_cache(), torch.inference_mode():
        inside = compiled(variant, policy, kwargs)
        with inside():
            cold = run_pass(items)
        first_graphs = counters["stats"]["unique_graphs"]
        print(
            f"  {label}: cold pass {sum(t[0] for t in cold):.1f} CPU s, {first_graphs} graphs, "
            f"load average {os.getloadavg()[0]:.2f}",
            file=sys.stderr,
            flush=True,
        )
        warm, plain = [], []
        for _ in range(args.repeats):
            with inside():
                warm.append(run_pass(items))
            plain.append(run_pass(items))
            print(
                f"  {label}: warm pass {sum(t[0] for t in warm[-1]):.1f} CPU s, uncompiled "
                f"{sum(t[0] for t in plain[-1]):.1f}, load average {os.getloadavg()[0]:.2f}",
                file=sys.stderr,
                flush=True,
            )
    best = [min(p[i][0] for p in warm) for i in range(len(items))]
    compile_cpu = sum(t[0] for t in cold) - sum(best)
    compile_wall = sum(t[1] for t in cold) - sum(min(p[i][1] for p in warm) for i in range(len(items)))
    rates, tokens = rates_of(warm, items, args)
    plain_rates, _ = rates_of(plain, items, args)
    pairs = [(a[3], b[3]) for a, b in zip(cold, plain[0]) if a[3]]
    rows = [(x, y) for a, b in pairs for x, y in zip(a, b)]
    same_rows = f"{sum(x == y for x, y in rows)}/{len(rows)}" if rows else ""
    graphs = counters["stats"]["unique_graphs"]
    return Result(
        variant,
        dtype_name,
        mode,
        compile_cpu,
        compile_wall,
        graphs,
        sum(counters["graph_break"].values()),
        graphs - first_graphs,
        rates,
        plain_rates,
        tokens,
        same_rows,
    )


# --- the report -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="smollm2-135m", help="model name (a tiny variant, smollm2-135m, a local HF directory)"
    )
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR, help="converted-model cache")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--dtypes", default="bf16", help="comma-separated: fp32, bf16 (what a node decodes in here)")
    parser.add_argument("--modes", default="default", help="torch.compile modes, comma-separated")
    parser.add_argument(
        "--backend", default="inductor", help="torch.compile backend (eager: dynamo alone, no code generation)"
    )
    parser.add_argument("--batches", default="8,32", help="fixed decode batch sizes")
    parser.add_argument("--steps", type=int, default=32, help="decoding steps per row in the fixed batches")
    parser.add_argument("--round-prompts", type=int, default=4, help="questions per measured round")
    parser.add_argument("--round-samples", type=int, default=8, help="samples per question")
    parser.add_argument("--round-tokens", type=int, default=64, help="max_new_tokens of a measured round")
    parser.add_argument("--hf-dtypes", default="fp32", help="the dtypes `hf static` runs in instead (bf16: autocast)")
    parser.add_argument("--repeats", type=int, default=2, help="warm passes (each followed by an uncompiled one)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: what a node sharing its CPU uses)")
    parser.add_argument("--smoke", action="store_true", help="tiny model, small batches, dynamo's eager backend")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.batches, args.steps, args.backend = "tiny", "4,8", 4, "eager"
        args.round_prompts, args.round_samples, args.round_tokens = 2, 4, 8
        args.variants, args.dtypes, args.hf_dtypes, args.repeats = "layer/oneDNN op,hf static", "bf16", "bf16", 1
    args.batch_list = [int(b) for b in args.batches.split(",") if b.strip()]
    args.variant_list = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variant_list if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.steps < 2 or not args.batch_list or min(args.batch_list) < 1:
        parser.error("--steps must be >= 2 and --batches positive")
    return args


def break_even(result: Result) -> tuple[str, str]:
    """Tokens, and measured rounds, of decoding that repay the compile: compile CPU seconds over
    the CPU seconds saved per token, at the rounds' rate (the largest fixed batch's without rounds)."""
    key = "round" if "round" in result.rates else list(result.rates)[-1]
    saved = 1 / result.plain[key] - 1 / result.rates[key]  # CPU seconds per token
    if saved <= 0:
        return "never", "never"
    tokens = max(result.compile_cpu, 0.0) / saved
    return f"{tokens:.0f}", (f"{tokens / result.round_tokens:.0f}" if result.round_tokens else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1  # compile in this process: its CPU time is on our clock
    torch._dynamo.config.recompile_limit = 64  # see every recompile rather than a silent fall-back to eager
    from sapo.training.policy import load_policy
    from sapo.training.tasks import TaskSampler, default_task_specs

    args.models_dir.mkdir(parents=True, exist_ok=True)
    policy = load_policy(args.model, device="cpu", seed=0, models_dir=args.models_dir, generation_precision="fp32")
    tasks = TaskSampler(default_task_specs(["basic_arithmetic"]), dataset_seed=0, rng_seed=0)
    rounds = [[policy.prompt(p) for p in tasks.sample(args.round_prompts)] for _ in range(2)]
    lengths = [max(len(ids) for ids in policy.tokenizer(r, add_special_tokens=False)["input_ids"]) for r in rounds]
    print(
        f"torch.compile and decoding {args.model}: torch {torch.__version__}, {args.threads} thread(s), backend "
        f"{args.backend}, CPU clock (process + gcc children)"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f} at the start"
    )
    print(
        f"rounds: {args.round_prompts} x {args.round_samples} up to {args.round_tokens} tokens, prompts of "
        f"{lengths[0]} and {lengths[1]} tokens; fixed batches {args.batches} x {args.steps} steps"
    )

    results: list[Result] = []
    failures = []
    for variant in args.variant_list:
        dtypes = args.hf_dtypes if variant.startswith("hf") else args.dtypes
        for dtype_name in [d.strip() for d in dtypes.split(",") if d.strip()]:
            for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
                try:
                    results.append(measure(variant, dtype_name, mode, policy, rounds, args))
                except Exception as error:  # one variant failing to compile must not hide the others
                    message = " ".join(str(error).split())[:600]
                    failures.append(f"{variant} {dtype_name} {mode}: {type(error).__name__}: {message}")
                    print(f"  FAILED {failures[-1]}", file=sys.stderr, flush=True)

    keys = [f"B={b}" for b in args.batch_list] + ["round"]
    header = ["variant", "dtype", "mode", "compile CPU s", "compile wall s", "graphs", "breaks"]
    header += [f"tok/CPU-s {k} compiled / not" for k in keys] + [
        "speedup " + " / ".join(keys),
        "break-even tokens",
        "rounds",
        "rows = uncompiled",
    ]
    table = [header]
    for r in results:
        tokens, rounds_needed = break_even(r)
        graphs = f"{r.graphs}" + (f" (+{r.later_graphs} later)" if r.later_graphs else "")
        table.append(
            [r.variant, r.dtype, r.mode, f"{r.compile_cpu:.1f}", f"{r.compile_wall:.1f}", graphs, str(r.graph_breaks)]
            + [f"{r.rates[k]:.1f} / {r.plain[k]:.1f}" if k in r.rates else "-" for k in keys]
            + [
                " / ".join(f"{r.rates[k] / r.plain[k]:.2f}" if k in r.rates else "-" for k in keys),
                tokens,
                rounds_needed,
                r.same_rows,
            ]
        )
    print()
    print(
        "compile s: the cold pass over the workload minus the best warm one (CPU: process + gcc; wall: inflated by "
        "load); graphs: dynamo graphs compiled (each a compile or recompile); 'not': the same workload uncompiled "
        "(LlamaDecoder as decode_samples runs it; hf: generate with the static cache), between the warm passes; "
        "break-even at the rounds' rate (hf: the largest batch's); rounds: break-even tokens / tokens of one measured round"
    )
    print_rows(table)
    for failure in failures:
        print(f"failed: {failure}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 1 if failures and not results else 0


if __name__ == "__main__":
    sys.exit(main())
