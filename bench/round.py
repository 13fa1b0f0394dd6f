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

    .venv/bin/python -m bench.round                      # tiny and smollm2-135m, sapo vs genrl vs TRL
    .venv/bin/python -m bench.round --models tiny --rounds 3 --no-lora --peers none
    .venv/bin/python -m bench.round --smoke              # tiny only, tiny sizes, < 20 s without peers
    bash bench/peer_bench/setup.sh                       # makes the peer venvs in bench/peers/

A round whose groups all have equal rewards has nothing to learn, and `grpo_update` skips it
(a random-weight tiny model scores 0 everywhere). With `--force-signal` (the default) such
groups get alternating 0/1 rewards before the update, in the peers too, so every framework
pays for a full update on every group: the timing is the worst case, not an accident of what
was sampled. The real reward mean and the number of groups with real signal are printed beside it.

Generation tokens/s is set against the memory-bandwidth bound of decoding (bench/bandwidth.py):
each step reads all weights and the batch's KV cache, at the measured copy bandwidth.

This file is the command line and the parent; sapo's arm is bench/round_sapo.py, the peers'
bench/round_peers.py, the tables bench/round_report.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench.bandwidth import copy_bandwidth_gbs
from bench.round_peers import DEFAULT_PEERS_DIR, PEERS, run_peer
from bench.round_report import add_decode_bound, load_average, print_table
from bench.round_sapo import run_model

RESULT_MARKER = "BENCH_ROUND_RESULT "
BENCH = Path(__file__).resolve().parent
DEFAULT_MODELS_DIR = BENCH / ".cache" / "models"


def build_parser() -> argparse.ArgumentParser:
    """The command line: the round's sizes, sapo's update, the peers to compare with, the outputs."""
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
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is what a node sharing a CPU uses)"
    )
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
    parser.add_argument(
        "--updates-per-batch",
        type=int,
        default=2,
        help="sapo's passes over the batch (node default 2; 1 with --minibatches 1 is the peers' one step)",
    )
    parser.add_argument("--minibatches", type=int, default=2, help="sapo's optimizer steps per pass (node default 2)")
    parser.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="sapo's update precision (--precision of a node; auto is fp32 on a CPU); the peers run fp32",
    )
    parser.add_argument("--device", default="cpu", help="sapo's device: cpu, cuda, cuda:N (the peers run on the CPU)")
    parser.add_argument(
        "--hf-generate",
        action="store_true",
        help="also time plain transformers generate on the last round's batch (same prompts x G, cap, "
        "stop tag and precision), beside sapo's generate step",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write each result row as a JSON line here")
    parser.add_argument(
        "--bound",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure this thread's matmul rates and print the update against its compute bound",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # one model, in a child process
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.questions, args.generations, args.max_new_tokens, args.rounds = "tiny", 2, 4, 16, 2
        args.bandwidth_mb = 64
    for name in ("questions", "generations", "max_new_tokens", "rounds", "threads", "peer_micro_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    args.peer_list = (
        [] if args.peers.strip() in ("", "none") else [p.strip() for p in args.peers.split(",") if p.strip()]
    )
    unknown = sorted(set(args.peer_list) - set(PEERS))
    if unknown:
        parser.error(f"--peers: unknown {', '.join(unknown)}; choose from {', '.join(PEERS)} or 'none'")
    return args


# --- the parent: one child per model and framework, then the table -------------------------------


def run_child(args: argparse.Namespace, model: str, argv: list[str]) -> dict:
    command = [sys.executable, "-m", "bench.round", *argv, "--worker", model]
    # stderr (progress lines, library warnings) passes straight through to ours.
    child = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=BENCH.parent)
    for line in child.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    raise SystemExit(f"benchmark of {model!r} failed (exit {child.returncode}); its output:\n{child.stdout}")


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
        rows = [
            {key: value for key, value in r.items() if key != "peer_job"} | {"bandwidth_gbs": bandwidth}
            for r in results
        ]
        args.json.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
