"""Where the GRPO update's time goes: torch.profiler over bench/round.py's round, op by op.

One node as bench/round.py builds it (same model, questions, seed and settings; 1 torch thread)
runs its round's generation through `run_round`; its training rows are then updated on from
the same starting weights once per setting (`--settings 1x1,2x2`: updates_per_batch x
minibatches; 1x1 is the peers' one step, 2x2 the node's defaults), each under torch.profiler.
Every op's own (self) time is put in one bucket (the profiler clocks ops by the wall, which on a
shared machine includes waiting for a core: each op's share of the update's wall time is
scaled to the update's CPU time):

- by phase, from the `record_function` labels in training/learning/update.py: encode, old log-probs
  (the no-grad pass), forward, backward, optimizer (gradient clipping and Adam), the rest;
- by what the op computes: the frozen base's linear layers (forward, and backward split into
  the input gradient and any weight gradient), the LoRA factors, the vocabulary projection
  (lm_head), the log-softmax over the vocabulary, attention, and the elementwise rest (norms,
  rotary embeddings, activations, residual adds, masks, copies and casts);
- "outside torch ops": the update's CPU time less the ops' self time (Python, the dispatcher's
  glue and the profiler itself).

Also printed: the positions run through the model (from a hook on the embedding) against the
real tokens, so padding shows; the system CPU time and page faults (memory the allocator gives
back to the OS and faults in again); and whether any frozen base weight got a gradient.

    .venv/bin/python -m bench.update_profile                         # smollm2-135m LoRA, 1x1 and 2x2
    .venv/bin/python -m bench.update_profile --settings 1x1 --top 25  # and the 25 costliest ops
    .venv/bin/python -m bench.update_profile --smoke                 # tiny, seconds
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from bench.round_sapo import bench_node
from bench.text_table import print_rows

BENCH = Path(__file__).resolve().parent
DEFAULT_MODELS_DIR = BENCH / ".cache" / "models"
MATMULS = ("aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm", "mkldnn::_linear_pointwise")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lora", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--settings", default="1x1,2x2", help="updates_per_batch x minibatches, comma-separated")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto", help="the update's precision")
    parser.add_argument("--top", type=int, default=0, help="also list the N ops with the most self CPU time")
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    parser.add_argument("--smoke", action="store_true", help="tiny, 2 questions x 4, 16 tokens")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.lora, args.questions, args.generations, args.max_new_tokens = "tiny", False, 2, 4, 16
    args.setting_list = []
    for text in args.settings.split(","):
        try:
            updates, minibatches = (int(x) for x in text.strip().split("x"))
        except ValueError:
            parser.error(f"--settings: {text!r} is not UPDATESxMINIBATCHES, e.g. 1x1 or 2x2")
        args.setting_list.append((updates, minibatches))
    return args


def round_rows(args: argparse.Namespace):
    """The node and its first round's training rows, generated as bench/round.py's round does."""
    import trio

    from bench.round_sapo import SignalForcingVerifier
    from sapo.node.core.counters import NodeCounters
    from sapo.node.core.memory_exchange import MemoryHub
    from sapo.node.core.round import run_round
    from sapo.training.models.devices import configure_torch_threads

    configure_torch_threads(args.threads)
    bench = argparse.Namespace(
        lora=args.lora,
        models_dir=args.models_dir,
        questions=args.questions,
        generations=args.generations,
        max_new_tokens=args.max_new_tokens,
        updates_per_batch=1,
        minibatches=1,
        threads=args.threads,
        seed=args.seed,
        precision=args.precision,
        device="cpu",
    )  # the profile is of the CPU update
    args.models_dir.mkdir(parents=True, exist_ok=True)
    # the rows, not an update (a node that does not train): each setting starts afresh
    data_dir = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    node = bench_node(bench, args.model, data_dir, SignalForcingVerifier(True), trains=False)
    hub = MemoryHub(time.time, rg_version="bench").join(
        node.peer_id, node.settings, memory=None, counters=NodeCounters()
    )
    result = trio.run(run_round, node, node.start_state(), hub, trio.Lock())
    return node, result.training_set.rows, result.generation.new_tokens


def ancestors(event) -> list:
    chain = []
    while event is not None:
        chain.append(event)
        event = event.cpu_parent
    return chain[::-1]


def shapes_of(event) -> list[tuple[int, ...]]:
    return [tuple(s) for s in (event.input_shapes or []) if isinstance(s, (list, tuple)) and s]


def matmul_kind(events: list, vocab: int, rank: int | None) -> str:
    """lm_head, LoRA or base, from the shapes the matmul ops saw."""
    dims = {d for e in events for s in shapes_of(e) for d in s}
    if vocab in dims:
        return "lm_head"
    if rank is not None and rank in dims:
        return "LoRA factors"
    return "base linears"


def is_weight_gradient(event, weight_shapes: set[tuple[int, int]]) -> bool:
    """An mm whose product has a base weight's shape: [out, M] @ [M, in]."""
    shapes = shapes_of(event)
    return (
        event.name in ("aten::mm", "aten::addmm")
        and len(shapes) >= 2
        and (shapes[-2][0], shapes[-1][-1]) in weight_shapes
    )


def bucket(event, vocab: int, rank: int | None, weight_shapes: set[tuple[int, int]]) -> tuple[str, str]:
    """(phase, what) for an op's self time."""
    chain = ancestors(event)
    labels = [e.name for e in chain if e.name.startswith("update: ")]
    phase = labels[-1][len("update: ") :] if labels else "other"
    if phase == "optimizer" or phase == "encode":
        return phase, phase
    below = [e for e in chain if not e.name.startswith("update: ")]
    backward = next((e for e in below if e.name.startswith("autograd::engine::evaluate_function: ")), None)
    if backward is not None:
        node = backward.name.split(": ", 1)[1]
        if node.startswith("AccumulateGrad"):
            return phase, "LoRA factors"
        if node.startswith(("MmBackward", "AddmmBackward", "LinearBackward")):
            kind = matmul_kind([event], vocab, rank)
            if kind != "base linears":
                return phase, kind
            return phase, "base linears, weight gradient" if is_weight_gradient(
                event, weight_shapes
            ) else "base linears, input gradient"
        if "Attention" in node:
            return phase, "attention"
        if any(vocab in s for s in shapes_of(event)):
            return phase, "log-softmax over the vocabulary"
        return phase, "elementwise, norms, rotary, copies"
    top = below[0] if below else event
    if top.name in MATMULS:
        return phase, matmul_kind([top, event], vocab, rank)
    if "attention" in top.name:
        return phase, "attention"
    if top.name in ("aten::logsumexp", "aten::log_softmax", "aten::gather") or any(vocab in s for s in shapes_of(top)):
        return phase, "log-softmax over the vocabulary"
    if top.name == "aten::embedding":
        return phase, "embedding"
    return phase, "elementwise, norms, rotary, copies"


def profile_one(node, rows, updates: int, minibatches: int, seed: int, top: int) -> dict:
    from sapo.training.learning.update import grpo_update, make_optimizer

    policy = node.policy
    settings = node.training.model_copy(update={"updates_per_batch": updates, "minibatches": minibatches})
    start = {name: p.detach().clone() for name, p in policy.model.named_parameters() if p.requires_grad}
    optimizer = make_optimizer(policy, settings)
    config = (policy.model.get_base_model() if hasattr(policy.model, "get_base_model") else policy.model).config
    vocab = config.vocab_size
    rank = node.settings.model.lora_rank if node.settings.model.lora else None
    weight_shapes = {tuple(p.shape) for p in policy.model.parameters() if not p.requires_grad and p.dim() == 2}
    positions = {"grad": 0, "no grad": 0}
    embed = policy.model.get_input_embeddings()

    def count(module, inputs):
        positions["grad" if torch.is_grad_enabled() else "no grad"] += inputs[0].numel()

    hook = embed.register_forward_pre_hook(count)
    usage, times = resource.getrusage(resource.RUSAGE_SELF), os.times()
    cpu, wall = time.process_time(), time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        stats = grpo_update(policy, optimizer, rows, settings, random.Random(seed))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    after, times_after = resource.getrusage(resource.RUSAGE_SELF), os.times()
    hook.remove()
    frozen_grads = sum(1 for p in policy.model.parameters() if not p.requires_grad and p.grad is not None)
    with torch.no_grad():  # back to the round's starting weights for the next setting
        for name, p in policy.model.named_parameters():
            if name in start:
                p.copy_(start[name])
    totals: dict[tuple[str, str], float] = defaultdict(float)
    ops: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    # The profiler clocks ops by the wall; on a shared machine that includes waiting for a core.
    # Each op's share of the update's wall time, times the update's CPU time, is its CPU time
    # (assuming the waits are spread evenly over the update).
    scale = cpu / wall
    for event in prof.events():
        seconds = event.self_cpu_time_total / 1e6 * scale
        if seconds <= 0 or event.name.startswith("update: "):
            continue
        totals[bucket(event, vocab, rank, weight_shapes)] += seconds
        key = (event.name, str(shapes_of(event))[:70])
        ops[key][0] += seconds
        ops[key][1] += 1
    del prof
    gc.collect()  # the profiler's event tree is large and cyclic: free it before the next setting
    prompt_tokens = sum(
        len(node.policy.tokenizer(node.policy.prompt(p), add_special_tokens=False)["input_ids"]) for p in rows.problems
    )
    return {
        "setting": f"{updates}x{minibatches}",
        "cpu_s": cpu,
        "wall_s": wall,
        "system_s": times_after.system - times.system,
        "page_faults": after.ru_minflt - usage.ru_minflt,
        "totals": dict(totals),
        "stats": stats,
        "positions": positions,
        "prompt_tokens": prompt_tokens,
        "frozen_grads": frozen_grads,
        "top": sorted(ops.items(), key=lambda kv: -kv[1][0])[:top],
    }


def report(results: list[dict], args: argparse.Namespace, new_tokens: int) -> None:
    print(
        f"\nGRPO update profile: {args.model} {'LoRA r=16' if args.lora else 'full fine-tuning'}, "
        f"{args.questions} questions x {args.generations}, max_new_tokens={args.max_new_tokens}, seed {args.seed}, "
        f"{args.threads} thread(s), precision {args.precision}, torch {torch.__version__}; "
        f"load average {os.getloadavg()[0]:.2f}; {new_tokens} tokens generated"
    )
    for r in results:
        s = r["stats"]
        print(
            f"\n{r['setting']} (updates_per_batch x minibatches): {s.optimizer_steps} optimizer steps, "
            f"{s.sequences} rows, {s.tokens} completion tokens + {r['prompt_tokens']} prompt tokens; "
            f"update {r['cpu_s']:.2f} CPU s ({r['wall_s']:.2f} wall) under the profiler, of which system {r['system_s']:.2f} s "
            f"({r['page_faults']} page faults); positions run: {r['positions']['grad']} with gradients, "
            f"{r['positions']['no grad']} without; frozen weights with a gradient: {r['frozen_grads']}"
        )
        by_what: dict[str, float] = defaultdict(float)
        by_phase: dict[str, float] = defaultdict(float)
        for (phase, what), seconds in r["totals"].items():
            by_what[what] += seconds
            by_phase[phase] += seconds
        outside = r["cpu_s"] - sum(by_what.values())
        rows = [["what", "CPU s", "share"]]
        for what, seconds in sorted(by_what.items(), key=lambda kv: -kv[1]):
            rows.append([what, f"{seconds:.2f}", f"{100 * seconds / r['cpu_s']:.1f}%"])
        rows.append(
            ["outside torch ops (Python, glue, profiler)", f"{outside:.2f}", f"{100 * outside / r['cpu_s']:.1f}%"]
        )
        print_rows(rows)
        print()
        phases = [["phase", "CPU s in ops", "share"]]
        for phase, seconds in sorted(by_phase.items(), key=lambda kv: -kv[1]):
            phases.append([phase, f"{seconds:.2f}", f"{100 * seconds / r['cpu_s']:.1f}%"])
        print_rows(phases)
        if r["top"]:
            print()
            print_rows(
                [["op", "shapes", "calls", "self CPU s"]]
                + [[name, shapes, str(calls), f"{seconds:.3f}"] for (name, shapes), (seconds, calls) in r["top"]]
            )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    node, rows, new_tokens = round_rows(args)
    results = [profile_one(node, rows, u, m, args.seed, args.top) for u, m in args.setting_list]
    report(results, args, new_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
