"""sapo's arm of the round benchmark (bench/round.py), in a child process of its own: one model.

The node's own round without the network, `run_round` with a hub that has no other member:
sample problems, generate G completions each, score them with the task's verifier (timed
apart, and with --force-signal giving flat groups alternating 0/1 rewards), then `grpo_update`.
Its row carries the job the peers repeat (the same prompts, model directory and settings).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.bandwidth import DecodeGeometry
from bench.peer_bench.common import STEPS, force_signal, peak_rss_mb, reset_peak_rss, summarize

TASK = "basic_arithmetic"  # its easy settings (training.tasks.EASY_CONFIGS): SmolLM2 scores here


class SignalForcingVerifier:
    """The node's own verifier, timed, and with --force-signal giving flat groups alternating
    0/1 rewards (as the peers' force_signal does). Remembers the real rewards for the report."""

    def __init__(self, force: bool):
        self.force = force
        self.real: list[list[float]] = []
        self.seconds = self.cpu_seconds = 0.0

    def __call__(self, problem, completions: list[str]) -> list[float]:
        from sapo.training.problems.rewards import score_group

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


def bench_node(args: argparse.Namespace, model: str, data_dir: Path, verifier, trains: bool = True):
    """A node alone, with the bench's round: Q local questions, no external groups, no checkpoints
    (and, unless it `trains`, no update: --generate-only)."""
    from sapo.node.core.node import Node
    from sapo.node.core.settings import load_settings
    from sapo.node.study.nodes import peer_id_for

    settings = load_settings(
        {
            "model": model,
            "lora": args.lora,
            "device": args.device,
            "models_dir": args.models_dir,
            "warm_start_steps": 0,
            "tasks": [TASK],
            "local": args.questions,
            "external": 0,
            "generations": args.generations,
            "max_new_tokens": args.max_new_tokens,
            "updates_per_batch": args.updates_per_batch,
            "minibatches": args.minibatches,
            "torch_threads": args.threads,
            "seed": args.seed,
            "data_dir": data_dir,
            "checkpoint_every": 0,
            "precision": args.precision,
            "generate_only": not trains,
        }
    )
    # a real peer id: its local groups are framed for publishing, as the daemon's are
    return Node(settings, peer_id=peer_id_for(args.seed, 0), verifier=verifier)


def run_model(args: argparse.Namespace, model: str) -> dict:
    """The node's load, then --rounds rounds, as one result row (with the peers' job)."""
    import peft  # noqa: F401 - imported here so that load time is loading, not importing
    import transformers  # noqa: F401

    from sapo.node.core.counters import NodeCounters
    from sapo.node.core.memory_exchange import MemoryHub
    from sapo.training.models.devices import configure_torch_threads

    configure_torch_threads(args.threads)
    args.models_dir.mkdir(parents=True, exist_ok=True)
    verifier = SignalForcingVerifier(args.force_signal)
    data_dir = Path(tempfile.mkdtemp(prefix="bench-round-"))
    started = time.perf_counter()
    node = bench_node(args, model, data_dir, verifier)
    load = {"load_s": time.perf_counter() - started, "load_peak_rss_mb": peak_rss_mb()}
    alone = MemoryHub(time.time, rg_version="bench").join(
        node.peer_id, node.settings, memory=None, counters=NodeCounters()
    )
    load["peak_is_round_only"] = reset_peak_rss()
    rounds, batches = time_rounds(args, model, node, alone, verifier)
    bound = update_bound(args, node.policy, rounds)
    shutil.rmtree(data_dir, ignore_errors=True)
    plain = hf_generate(node.policy, batches[-1]["prompts"], args) if args.hf_generate else None
    return result_row(args, model, node, rounds, batches, load | {"update_bound": bound, "hf_generate": plain})


def time_rounds(args: argparse.Namespace, model: str, node, alone, verifier) -> tuple[list[dict], list[dict]]:
    """Each round's times and counts, and its batch (the prompts and answers the peers repeat)."""
    import trio

    from sapo.node.core.round import run_round
    from sapo.training.learning.grpo import has_signal

    policy = node.policy
    rounds, batches = [], []
    state = node.start_state()
    for round_index in range(1, args.rounds + 1):
        result = trio.run(run_round, node, state, alone, trio.Lock())
        state, generation, update = result.state, result.generation, result.update
        real, score_s, score_cpu_s = verifier.take()
        times = {
            "generate_s": generation.seconds - score_s,
            "generate_cpu_s": generation.cpu_seconds - score_cpu_s,
            "score_s": score_s,
            "score_cpu_s": score_cpu_s,
            "update_s": update.seconds,
            "update_cpu_s": update.cpu_seconds,
        }
        times |= {
            "total_s": sum(times[f"{s}_s"] for s in STEPS),
            "total_cpu_s": sum(times[f"{s}_cpu_s"] for s in STEPS),
        }
        real_signal = sum(1 for r in real if has_signal(r))
        real_mean = sum(map(sum, real)) / sum(map(len, real))
        problems = [g.problem for g in generation.groups]
        prompts = [policy.prompt(p) for p in problems]
        prompt_lengths = [len(ids) for ids in policy.tokenizer(prompts, add_special_tokens=False)["input_ids"]]
        batches.append(
            {"prompts": prompts, "answers": [p.answer for p in problems], "padded_prompt": max(prompt_lengths)}
        )
        rounds.append(
            {
                **times,
                "tokens": generation.new_tokens,
                "update_skipped": update.skipped,
                "update_tokens": update.tokens,
                # each trained group's prompt, once: what the update's compute bound counts
                "update_prompt_tokens": sum(
                    len(ids)
                    for ids in policy.tokenizer(
                        [policy.prompt(p) for p in result.training_set.rows.problems], add_special_tokens=False
                    )["input_ids"]
                ),
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
    return rounds, batches


def result_row(
    args: argparse.Namespace, model: str, node, rounds: list[dict], batches: list[dict], measured: dict
) -> dict:
    """The timed rounds' means, the model's sizes, memory and decode geometry, and the peers' job.
    `measured`: load_s, load_peak_rss_mb, peak_is_round_only, update_bound and hf_generate."""
    from importlib.metadata import version

    import torch

    policy = node.policy
    summary = summarize(rounds)
    timed = rounds[-summary["timed_rounds"] :]
    geometry = DecodeGeometry.of(policy.model)
    return {
        "framework": "sapo",
        "version": f"sapo {version('sapo')}, transformers {version('transformers')}, torch {torch.__version__}",
        "model": model,
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "trainable": sum(p.numel() for p in policy.trainable_parameters()),
        "load_s": measured["load_s"],
        "load_peak_rss_mb": measured["load_peak_rss_mb"],
        "round_peak_rss_mb": peak_rss_mb(),
        "device": str(policy.device),
        "gpu_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if policy.device.type == "cuda" else None,
        "hf_generate": measured["hf_generate"],
        "peak_is_round_only": measured["peak_is_round_only"],
        "skipped_updates": sum(r["update_skipped"] for r in timed),
        "optimizer_steps": max(r["optimizer_steps"] for r in timed),
        **summary,
        "decode_batch": args.questions * args.generations,  # one generate call for all Q x G
        "geometry": {"weight_bytes": geometry.weight_bytes, "kv_bytes_per_token": geometry.kv_bytes_per_token},
        "update_bound": measured["update_bound"],
        "update_precision": "bf16" if policy.bf16 else "fp32",
        # mean context of a decoding step if the batch runs max_new_tokens steps
        "decode_context": sum(b["padded_prompt"] for b in batches[-len(timed) :]) / len(timed)
        + args.max_new_tokens / 2,
        "peer_job": peer_job(args, model, node, batches),
    }


def peer_job(args: argparse.Namespace, model: str, node, batches: list[dict]) -> dict:
    """What a peer framework needs to run the same rounds: model directory, prompts, settings."""
    settings, rank = node.training, node.settings.model.lora_rank
    return {
        "model": model,
        "model_dir": export_for_peers(model, args) if args.peer_list else None,
        "batches": [{"prompts": b["prompts"], "answers": b["answers"]} for b in batches],
        "prompt_token_ids": node.policy.tokenizer(batches[0]["prompts"][0], add_special_tokens=False)["input_ids"],
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
    }


def hf_generate(policy, prompts: list[str], args: argparse.Namespace) -> dict:
    """Plain transformers `generate` on a round's batch: the same prompts x G samples, cap and
    `</answer>` stop, temperature 1 and no top-k, on a merged copy of the policy in the precision
    sapo's sampling runs in (its bf16 copy of the weights where chosen). One warm-up call first."""
    import copy

    import torch

    from sapo.training.completions.generation import ANSWER_CLOSE

    model = copy.deepcopy(policy.model)
    if policy.lora:
        model = model.merge_and_unload()
    model = model.to(policy.generation_dtype).eval()
    tokenizer = policy.tokenizer
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(policy.device)
    options = dict(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        num_return_sequences=args.generations,
        stop_strings=[ANSWER_CLOSE],
        tokenizer=tokenizer,
        pad_token_id=tokenizer.pad_token_id,
    )

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
    for row in out[:, enc["input_ids"].shape[1] :].tolist():  # a row ends at its first EOS or pad
        tokens += next((i for i, t in enumerate(row) if t in ended), len(row))
    del model
    return {
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "rows": len(out),
        "dtype": str(policy.generation_dtype).removeprefix("torch."),
    }


def update_bound(args: argparse.Namespace, policy, rounds: list[dict]) -> dict | None:
    """The timed rounds' update against its compute bound (bench/update_bound.py): the matmul
    FLOPs of its forward and input-gradient passes, at this thread's measured fp32 and bf16 rates."""
    from bench.update_bound import UpdateWork, bound_seconds, matmul_rates, update_flops

    if not args.bound:
        return None
    timed = rounds[1:] if len(rounds) > 1 else rounds
    config = (policy.model.get_base_model() if hasattr(policy.model, "get_base_model") else policy.model).config
    rates = matmul_rates(config)
    seconds, total = {"fp32": 0.0, "bf16": 0.0}, 0.0
    for r in timed:
        work = UpdateWork(
            r["update_prompt_tokens"],
            r["update_tokens"],
            args.updates_per_batch,
            args.minibatches,
            weight_gradients=not args.lora,
        )
        flops = update_flops(config, work)
        total += sum(flops.values()) / len(timed)
        for dtype in seconds:
            seconds[dtype] += bound_seconds(flops, rates[dtype]) / len(timed)
    return {"tflop": total / 1e12, "seconds": seconds, "gflops": {d: total / 1e9 / seconds[d] for d in seconds}}


def export_for_peers(model: str, args: argparse.Namespace) -> str | None:
    """A plain HF directory (model + tokenizer) of the same initial weights, for the peers to load."""
    from sapo.training.models.sources import is_tiny
    from sapo.training.models.tiny import build_tiny

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
