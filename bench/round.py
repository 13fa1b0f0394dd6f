"""Time one GRPO round (generate, score, encode + update) per model, against genrl and TRL.

Each model runs in its own child process, so its peak RSS and its load time are its own.
The round is the node's round without the network: sample problems, generate G completions
each (`sample_completions`, as `generate_groups` does), score them with the task's verifier
(`score_group`), then `grpo_update` (which re-encodes the text and takes the clipped steps).

The same round then runs in each peer framework, each in its own venv and child process,
through its own public API (bench/peer_bench/): Gensyn's genrl 0.1.11 and 0.3.0 (peers
`genrl` and `genrl-0.3`: `GRPOLanguageTrainerModule.generate` and `.train`) and TRL's
`GRPOTrainer` (one step of Q x G sequences). Same model directory, same prompt text (the project's, checked token for
token), same G, max_new_tokens, LoRA, lr, seed and torch threads. A peer that is not
installed or fails is reported with its error, never given a row.

    .venv/bin/python bench/round.py                      # tiny and smollm2-135m, sapo vs genrl vs TRL
    .venv/bin/python bench/round.py --models tiny --rounds 3 --no-lora --peers none
    .venv/bin/python bench/round.py --smoke              # tiny only, tiny sizes, < 20 s without peers
    bash bench/peer_bench/setup.sh                       # makes the peer venvs in bench/peers/

A round whose groups all have equal rewards has nothing to learn, and `grpo_update` skips it
(a random-weight tiny model scores 0 everywhere). With `--force-signal` (the default) such
groups get alternating 0/1 rewards before the update, in the peers too, so every framework
pays for a full update on every group: the timing is the worst case, not an accident of what
was sampled. The real reward mean and the number of groups with real signal are printed beside it.

Generation tokens/s is set against the memory-bandwidth bound of decoding (bench/bandwidth.py):
each step reads all weights and the batch's KV cache, at the measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bandwidth import DecodeGeometry, copy_bandwidth_gbs, decode_bound_tokens_per_s
from peer_bench.common import RESULT_MARKER as PEER_RESULT_MARKER
from peer_bench.common import STEPS, force_signal, peak_rss_mb, reset_peak_rss, summarize

RESULT_MARKER = "BENCH_ROUND_RESULT "
BENCH = Path(__file__).resolve().parent
DEFAULT_MODELS_DIR = BENCH / ".cache" / "models"
DEFAULT_PEERS_DIR = BENCH / "peers"
# peer name -> its adapter in bench/peer_bench/, run with bench/peers/<name>/bin/python
PEERS = {"genrl": "genrl_round.py", "genrl-0.3": "genrl_round.py", "trl": "trl_round.py"}
TASK = "basic_arithmetic"  # its easy settings (training.tasks.EASY_CONFIGS): SmolLM2 scores here


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,smollm2-135m", help="comma-separated model names")
    parser.add_argument("--questions", type=int, default=4, help="questions per round")
    parser.add_argument("--generations", type=int, default=8, help="G: completions per question")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="generation cap per completion")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per model; the first is a warm-up if > 1")
    parser.add_argument(
        "--lora",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train a LoRA adapter (r=16) rather than the full model (default: LoRA, as `make run`)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is what a node sharing a CPU uses)")
    parser.add_argument("--seed", type=int, default=0, help="model, task and sampling seed (same for every model)")
    parser.add_argument(
        "--force-signal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="give all-equal-reward groups alternating 0/1 rewards so the update is never skipped",
    )
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR, help="converted-model cache")
    parser.add_argument(
        "--peers", default=",".join(PEERS), help=f"peer frameworks to compare with: {', '.join(PEERS)}, or 'none'"
    )
    parser.add_argument(
        "--peers-dir", type=Path, default=DEFAULT_PEERS_DIR, help="where bench/peer_bench/setup.sh made the peer venvs"
    )
    parser.add_argument(
        "--peer-micro-batch",
        type=int,
        default=8,
        help="TRL's per_device_train_batch_size (gradient accumulation makes up Q x G); genrl has no such option",
    )
    parser.add_argument("--peer-timeout", type=float, default=3600, help="seconds before a peer's run is abandoned")
    parser.add_argument("--bandwidth-mb", type=float, default=256, help="size of the copy that measures bandwidth")
    parser.add_argument("--smoke", action="store_true", help="tiny only, tiny sizes: a quick check that this runs")
    parser.add_argument("--updates-per-batch", type=int, default=2,
                        help="sapo's passes over the batch (node default 2; 1 with --minibatches 1 is the peers' one step)")
    parser.add_argument("--minibatches", type=int, default=2, help="sapo's optimizer steps per pass (node default 2)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="sapo's update precision (--precision of a node; auto is fp32 on a CPU); the peers run fp32")
    parser.add_argument("--device", default="cpu", help="sapo's device: cpu, cuda, cuda:N (the peers run on the CPU)")
    parser.add_argument("--hf-generate", action="store_true",
                        help="also time plain transformers generate on the last round's batch (same prompts x G, cap, "
                             "stop tag and precision), beside sapo's generate step")
    parser.add_argument("--json", type=Path, default=None, help="also write each result row as a JSON line here")
    parser.add_argument("--bound", action=argparse.BooleanOptionalAction, default=True,
                        help="measure this thread's matmul rates and print the update against its compute bound")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # one model, in a child process
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.questions, args.generations, args.max_new_tokens, args.rounds = "tiny", 2, 4, 16, 2
        args.bandwidth_mb = 64
    for name in ("questions", "generations", "max_new_tokens", "rounds", "threads", "peer_micro_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    args.peer_list = [] if args.peers.strip() in ("", "none") else [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(args.peer_list) - set(PEERS))
    if unknown:
        parser.error(f"--peers: unknown {', '.join(unknown)}; choose from {', '.join(PEERS)} or 'none'")
    return args


# --- the child: one model ----------------------------------------------------------------------


class SignalForcingVerifier:
    """The node's own verifier, timed, and with --force-signal giving flat groups alternating
    0/1 rewards (as the peers' force_signal does). Remembers the real rewards for the report."""

    def __init__(self, force: bool):
        self.force = force
        self.real: list[list[float]] = []
        self.seconds = self.cpu_seconds = 0.0

    def __call__(self, problem, completions: list[str]) -> list[float]:
        from sapo.training.rewards import score_group

        wall, cpu = time.perf_counter(), time.process_time()
        rewards = score_group(problem, completions)
        self.real.append(rewards)
        self.seconds += time.perf_counter() - wall
        self.cpu_seconds += time.process_time() - cpu
        return force_signal(rewards) if self.force else rewards

    def take(self) -> tuple[list[list[float]], float, float]:
        """This round's real rewards and scoring seconds (wall, CPU), then start afresh."""
        taken = self.real, self.seconds, self.cpu_seconds
        self.real, self.seconds, self.cpu_seconds = [], 0.0, 0.0
        return taken


def bench_node(args: argparse.Namespace, model: str, data_dir: Path, verifier):
    """A node alone, with the bench's round: Q local questions, no external groups, no checkpoints."""
    from sapo.node.core.node import Node
    from sapo.node.core.settings import load_settings
    from sapo.node.study.nodes import peer_id_for

    settings = load_settings({
        "model": model, "lora": args.lora, "device": args.device, "models_dir": args.models_dir, "warm_start_steps": 0,
        "tasks": [TASK], "local": args.questions, "external": 0, "generations": args.generations,
        "max_new_tokens": args.max_new_tokens, "updates_per_batch": args.updates_per_batch,
        "minibatches": args.minibatches, "torch_threads": args.threads, "seed": args.seed,
        "data_dir": data_dir, "checkpoint_every": 0, "precision": args.precision,
    })
    # a real peer id: its local groups are framed for publishing, as the daemon's are
    return Node(settings, peer_id=peer_id_for(args.seed, 0), verifier=verifier)


def run_model(args: argparse.Namespace, model: str) -> dict:
    from importlib.metadata import version

    import torch
    import trio

    from sapo.node.core.counters import NodeCounters
    from sapo.node.core.memory_exchange import MemoryHub
    from sapo.node.core.round import run_round
    from sapo.training.grpo import has_signal

    import peft  # noqa: F401 - imported here so that load time is loading, not importing
    import transformers  # noqa: F401

    from sapo.training.devices import configure_torch_threads

    configure_torch_threads(args.threads)
    args.models_dir.mkdir(parents=True, exist_ok=True)
    verifier = SignalForcingVerifier(args.force_signal)
    data_dir = Path(tempfile.mkdtemp(prefix="bench-round-"))
    started = time.perf_counter()
    node = bench_node(args, model, data_dir, verifier)
    policy = node.policy
    load_seconds = time.perf_counter() - started
    load_peak = peak_rss_mb()
    alone = MemoryHub(time.time, rg_version="bench").join(node.peer_id, node.settings, inbox=None, counters=NodeCounters())
    peak_is_round_only = reset_peak_rss()

    rounds, batches = [], []
    state = node.start_state()
    for round_index in range(1, args.rounds + 1):
        result = trio.run(run_round, node, state, alone, trio.Lock())
        state, generation, update = result.state, result.generation, result.update
        real, score_s, score_cpu_s = verifier.take()
        times = {
            "generate_s": generation.seconds - score_s, "generate_cpu_s": generation.cpu_seconds - score_cpu_s,
            "score_s": score_s, "score_cpu_s": score_cpu_s,
            "update_s": update.seconds, "update_cpu_s": update.cpu_seconds,
        }
        times |= {"total_s": sum(times[f"{s}_s"] for s in STEPS), "total_cpu_s": sum(times[f"{s}_cpu_s"] for s in STEPS)}
        real_signal = sum(1 for r in real if has_signal(r))
        real_mean = sum(map(sum, real)) / sum(map(len, real))
        problems = [g.problem for g in generation.groups]
        prompts = [policy.prompt(p) for p in problems]
        prompt_lengths = [len(ids) for ids in policy.tokenizer(prompts, add_special_tokens=False)["input_ids"]]
        batches.append({"prompts": prompts, "answers": [p.answer for p in problems], "padded_prompt": max(prompt_lengths)})
        rounds.append(
            {
                **times,
                "tokens": generation.new_tokens,
                "update_skipped": update.skipped,
                "update_tokens": update.tokens,
                # each trained group's prompt, once: what the update's compute bound counts
                "update_prompt_tokens": sum(len(ids) for ids in policy.tokenizer(
                    [policy.prompt(p) for p in result.training_set.rows.problems], add_special_tokens=False)["input_ids"]),
                "real_reward_mean": real_mean,
                "real_signal_groups": real_signal,
                "optimizer_steps": update.optimizer_steps,
            }
        )
        print(
            f"  [sapo {model}] round {round_index}{' (warm-up)' if args.rounds > 1 and round_index == 1 else ''}: "
            + ", ".join(f"{s} {times[f'{s}_s']:.2f}s (CPU {times[f'{s}_cpu_s']:.2f}s)" for s in STEPS)
            + f", {generation.new_tokens} tokens, real reward {real_mean:.3f}, "
            f"{real_signal}/{len(generation.groups)} groups with real signal",
            file=sys.stderr,
            flush=True,
        )
    settings, rank = node.training, node.settings.model.lora_rank
    bound = update_bound(args, policy, rounds)
    shutil.rmtree(data_dir, ignore_errors=True)
    plain = hf_generate(policy, batches[-1]["prompts"], args) if args.hf_generate else None
    summary = summarize(rounds)
    timed = rounds[-summary["timed_rounds"] :]
    geometry = DecodeGeometry.of(policy.model)
    return {
        "framework": "sapo",
        "version": f"sapo {version('sapo')}, transformers {version('transformers')}, torch {torch.__version__}",
        "model": model,
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "trainable": sum(p.numel() for p in policy.trainable_parameters()),
        "load_s": load_seconds,
        "load_peak_rss_mb": load_peak,
        "round_peak_rss_mb": peak_rss_mb(),
        "device": str(policy.device),
        "gpu_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if policy.device.type == "cuda" else None,
        "hf_generate": plain,
        "peak_is_round_only": peak_is_round_only,
        "skipped_updates": sum(r["update_skipped"] for r in timed),
        "optimizer_steps": max(r["optimizer_steps"] for r in timed),
        **summary,
        "decode_batch": args.questions * args.generations,  # one generate call for all Q x G
        "geometry": {"weight_bytes": geometry.weight_bytes, "kv_bytes_per_token": geometry.kv_bytes_per_token},
        "update_bound": bound,
        "update_precision": "bf16" if policy.bf16 else "fp32",
        # mean context of a decoding step if the batch runs max_new_tokens steps
        "decode_context": sum(b["padded_prompt"] for b in batches[-len(timed):]) / len(timed) + args.max_new_tokens / 2,
        "peer_job": {
            "model": model,
            "model_dir": export_for_peers(model, args) if args.peer_list else None,
            "batches": [{"prompts": b["prompts"], "answers": b["answers"]} for b in batches],
            "prompt_token_ids": policy.tokenizer(batches[0]["prompts"][0], add_special_tokens=False)["input_ids"],
            "generations": args.generations,
            "max_new_tokens": args.max_new_tokens,
            "temperature": settings.temperature,
            "lr": settings.lr,
            "lora": {"rank": rank, "alpha": 2 * rank, "dropout": 0.0} if args.lora else None,
            "eps_low": settings.eps_low,
            "eps_high": settings.eps_high,
            "threads": args.threads,
            "seed": args.seed,
            "force_signal": args.force_signal,
            "peer_micro_batch": args.peer_micro_batch,
        },
    }


def hf_generate(policy, prompts: list[str], args: argparse.Namespace) -> dict:
    """Plain transformers `generate` on a round's batch: the same prompts x G samples, cap and
    `</answer>` stop, temperature 1 and no top-k, on a merged copy of the policy in the precision
    sapo's sampling runs in (its bf16 copy of the weights where chosen). One warm-up call first."""
    import copy

    import torch

    from sapo.training.generation import ANSWER_CLOSE

    model = copy.deepcopy(policy.model)
    if policy.lora:
        model = model.merge_and_unload()
    model = model.to(policy.generation_dtype).eval()
    tokenizer = policy.tokenizer
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(policy.device)
    options = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=args.generations,
                   stop_strings=[ANSWER_CLOSE], tokenizer=tokenizer, pad_token_id=tokenizer.pad_token_id)

    def synchronize() -> None:
        if policy.device.type == "cuda":
            torch.cuda.synchronize(policy.device)

    torch.manual_seed(args.seed)
    with torch.inference_mode():
        model.generate(**enc, max_new_tokens=2, **options)  # first-call costs of these shapes
        synchronize()
        started = time.perf_counter()
        out = model.generate(**enc, max_new_tokens=args.max_new_tokens, **options)
        synchronize()
        seconds = time.perf_counter() - started
    ended = {tokenizer.pad_token_id, tokenizer.eos_token_id}
    tokens = 0
    for row in out[:, enc["input_ids"].shape[1]:].tolist():  # a row ends at its first EOS or pad
        tokens += next((i for i, t in enumerate(row) if t in ended), len(row))
    del model
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "rows": len(out),
            "dtype": str(policy.generation_dtype).removeprefix("torch.")}


def update_bound(args: argparse.Namespace, policy, rounds: list[dict]) -> dict | None:
    """The timed rounds' update against its compute bound (bench/update_bound.py): the matmul
    FLOPs of its forward and input-gradient passes, at this thread's measured fp32 and bf16 rates."""
    from update_bound import UpdateWork, bound_seconds, matmul_rates, update_flops

    if not args.bound:
        return None
    timed = rounds[1:] if len(rounds) > 1 else rounds
    config = (policy.model.get_base_model() if hasattr(policy.model, "get_base_model") else policy.model).config
    rates = matmul_rates(config)
    seconds, total = {"fp32": 0.0, "bf16": 0.0}, 0.0
    for r in timed:
        work = UpdateWork(r["update_prompt_tokens"], r["update_tokens"], args.updates_per_batch, args.minibatches,
                          weight_gradients=not args.lora)
        flops = update_flops(config, work)
        total += sum(flops.values()) / len(timed)
        for dtype in seconds:
            seconds[dtype] += bound_seconds(flops, rates[dtype]) / len(timed)
    return {"tflop": total / 1e12, "seconds": seconds,
            "gflops": {d: total / 1e9 / seconds[d] for d in seconds}}


def export_for_peers(model: str, args: argparse.Namespace) -> str | None:
    """A plain HF directory (model + tokenizer) of the same initial weights, for the peers to load."""
    from sapo.training.sources import is_tiny
    from sapo.training.tiny import build_tiny

    if is_tiny(model):
        folder = args.models_dir / f"{model}-seed{args.seed}"
        base, tokenizer = build_tiny(model, args.seed)  # the same weights load_policy built
        base.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return str(folder)
    if model == "smollm2-135m":
        return str(args.models_dir / "smollm2-135m")  # the fp32 cache load_policy just used
    path = Path(model).expanduser()
    return str(path) if path.is_dir() else None  # a hub id: the offline peers cannot load it


# --- the parent: one child per model and framework, then the table -------------------------------


def run_child(args: argparse.Namespace, model: str, argv: list[str]) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", model]
    # stderr (progress lines, library warnings) passes straight through to ours.
    child = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    for line in child.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    raise SystemExit(f"benchmark of {model!r} failed (exit {child.returncode}); its output:\n{child.stdout}")


def run_peer(args: argparse.Namespace, peer: str, job: dict) -> dict | str:
    """The peer's result, or why there is none (its real error)."""
    python = args.peers_dir / peer / "bin" / "python"
    if not python.exists():
        return f"not installed: {python} is missing; make it with `bash bench/peer_bench/setup.sh`"
    if job["model_dir"] is None:
        return f"no local model directory for {job['model']!r} (the peers load one offline)"
    with tempfile.TemporaryDirectory(prefix=f"bench-{peer}-") as tmp:
        job_file = Path(tmp) / "job.json"
        job_file.write_text(json.dumps({**job, "peer": peer}))  # the name its result and log lines carry
        threads = str(args.threads)
        env = {
            **os.environ,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "WANDB_MODE": "disabled",
            "PYTHONUNBUFFERED": "1",
        }
        command = [str(python), str(BENCH / "peer_bench" / PEERS[peer]), str(job_file)]
        try:
            child = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp, timeout=args.peer_timeout)
        except subprocess.TimeoutExpired:
            return f"timed out after {args.peer_timeout:.0f} s (--peer-timeout)"
    for line in child.stderr.splitlines():
        if line.startswith(f"  [{peer}]"):
            print(line.replace(f"[{peer}]", f"[{peer} {job['model']}]"), file=sys.stderr, flush=True)
    for line in child.stdout.splitlines():
        if line.startswith(PEER_RESULT_MARKER):
            return json.loads(line[len(PEER_RESULT_MARKER) :])
    tail = "\n".join((child.stdout + child.stderr).strip().splitlines()[-20:])
    return f"failed (exit {child.returncode}); the end of its output:\n{indent(tail)}"


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def indent(text: str) -> str:
    return "\n".join("      " + line for line in text.splitlines())


def add_decode_bound(row: dict, sapo: dict, bandwidth_gbs: float) -> None:
    """The memory-bound decoding limit for the row's own decode batch."""
    geometry = DecodeGeometry(**sapo["geometry"])  # same model and LoRA in every framework
    row["bound_tokens_per_s"] = decode_bound_tokens_per_s(geometry, row["decode_batch"], sapo["decode_context"], bandwidth_gbs)


def print_table(
    args: argparse.Namespace, results: list[dict], missing: list[tuple[str, str, str]], bandwidth_gbs: float
) -> None:
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
    times = [
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
    details = [
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
    for columns in (times, details):
        print()
        print_rows([[h for h, _ in columns]] + [[fmt.format(**f) for _, fmt in columns] for f in fields])
    if results and not all(r["peak_is_round_only"] for r in results):
        print("note: this OS cannot reset the peak RSS; 'round' peak includes loading")
    if any(r["model"].startswith("tiny") for r in results):
        print("note: a tiny model's weights fit in the CPU caches, so its bandwidth bound means little")
    print_ratios(results)
    print_bounds(results)
    print()
    for framework in dict.fromkeys(r["framework"] for r in results):
        ran = [r for r in results if r["framework"] == framework]
        # a peer's update that leaves its trainable weights as they were is a broken update
        changed = ", ".join(f"{r['model']} {'yes' if r['weights_changed'] else 'NO'}" for r in ran if "weights_changed" in r)
        print(f"{framework}: {ran[0]['version']}" + (f"; update changed the trainable weights: {changed}" if changed else ""))
    for peer, model, reason in missing:
        print(f"{peer} ({model}) has no row: {reason}")
    for r in results:
        if r.get("hf_generate"):
            hf = r["hf_generate"]
            print(f"{r['model']} on {r['device']}: plain transformers generate ({hf['dtype']}, merged weights) of the last "
                  f"round's {hf['rows']} rows: {hf['tokens']} tokens in {hf['seconds']:.2f} s = {hf['tokens_per_s']:.0f} "
                  f"tok/s; sapo's generate step: {r['tokens']:.0f} tokens in {r['generate_s']:.2f} s = "
                  f"{r['tokens_per_s']:.0f} tok/s ({r['tokens_per_s'] / hf['tokens_per_s']:.2f}x HF's tok/s)")
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
        rows.append([r["model"], f"sapo/{r['framework']}"] + [f"{sapo[k] / r[k]:.2f}" if r[k] > 0 else "-" for k in keys])
    if len(rows) == 1:
        return
    print()
    print("seconds per round, sapo / peer (below 1: sapo is faster)")
    print_rows(rows)


def print_bounds(results: list[dict]) -> None:
    """sapo's update against its compute bound at each precision (bench/update_bound.py)."""
    rows = [["model", "update precision", "update CPU s", "TFLOP", "fp32 bound s", "of fp32 bound", "bf16 bound s",
             "of bf16 bound"]]
    for r in results:
        bound = r.get("update_bound")
        if r["framework"] != "sapo" or not bound or r["update_cpu_s"] <= 0:
            continue
        cells = [r["model"], r["update_precision"], f"{r['update_cpu_s']:.2f}", f"{bound['tflop']:.3f}"]
        for dtype in ("fp32", "bf16"):
            seconds = bound["seconds"][dtype]
            cells += [f"{seconds:.2f} ({bound['gflops'][dtype]:.0f} GFLOPS)", f"{100 * seconds / r['update_cpu_s']:.0f}%"]
        rows.append(cells)
    if len(rows) == 1:
        return
    print()
    print("sapo's update against its compute bound: the matmul FLOPs of its forward and input-gradient passes over "
          "its tokens (each group's prompt once a pass, lm_head on completion tokens; bench/update_bound.py) at the "
          "fp32 and bf16 rates this thread measured at 256 rows (best of F.linear and oneDNN packed); "
          "'of bound' = bound s / update CPU s")
    print_rows(rows)


def print_rows(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        result = run_model(args, args.worker)
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return 0
    args.load_at_start = load_average()
    bandwidth = copy_bandwidth_gbs(args.bandwidth_mb, repeats=3, threads=args.threads, device=args.device)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    results, missing = [], []
    for model in models:
        print(f"benchmarking {model} ...", file=sys.stderr, flush=True)
        sapo = run_child(args, model, argv)
        add_decode_bound(sapo, sapo, bandwidth)
        results.append(sapo)
        for peer in args.peer_list:
            print(f"benchmarking {model} in {peer} ...", file=sys.stderr, flush=True)
            outcome = run_peer(args, peer, sapo["peer_job"])
            if isinstance(outcome, str):
                missing.append((peer, model, outcome))
                continue
            add_decode_bound(outcome, sapo, bandwidth)
            results.append(outcome)
    print_table(args, results, missing, bandwidth)
    if args.json:
        rows = [{key: value for key, value in r.items() if key != "peer_job"} | {"bandwidth_gbs": bandwidth} for r in results]
        args.json.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
