"""The paper's controlled run at its own scale, on one CUDA GPU: 8 nodes, the nine ReasoningGYM
tasks, 2000 rounds, 8/0 against 4/4 (and 2/6), GRPO with no KL, clip 0.2/0.28, Adam, binary
reward (arXiv 2509.08721, section 4).

It is `sapo-node experiment` with the paper's settings, so every node runs the daemon's own
round. All 8 nodes live in one process on the GPU and take turns (the study's torch lock):

- Qwen/Qwen2.5-0.5B-Instruct (the paper's model; needs the Hugging Face hub or a filled cache),
  full fine-tuning, bf16 autocast: 8 x (2 GB weights + 4 GB Adam) fits a 40 GB+ card;
- or smollm2-135m (offline, this project's built-in default) when the hub cannot be reached.

    .venv/bin/python -m bench.paper_scale --dry-run                # print the command and the plan
    .venv/bin/python -m bench.paper_scale --model smollm2-135m      # offline
    .venv/bin/python -m bench.paper_scale --max-minutes 600         # stop starting rounds after 10 h

Not run by this project yet: no GPU was lent to it. On a CPU it refuses to start (a SmolLM2 node
takes minutes per round there at the paper's batch; bench/smollm2_study.sh is the CPU-sized
study on SmolLM2, and `sapo-node experiment` with the tiny stand-in the quick one).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAPER_CONFIGS = "8/0,4/4,2/6"


def paper_command(args: argparse.Namespace) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "sapo.node.cli",
        "experiment",
        "--nodes",
        "8",
        "--configs",
        args.configs,
        "--rounds",
        str(args.rounds),
        "--seeds",
        str(args.seeds),
        "--out",
        str(args.out),
        "--jobs",
        "1",
        "--format-discovery",
        "1.0",
        "--ma-window",
        "100",
        # node settings: the paper's GRPO
        "--model",
        args.model,
        "--device",
        "cuda",
        "--precision",
        "auto",
        "--generations",
        "8",
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--temperature",
        "1.0",
        "--updates-per-batch",
        "1",
        "--minibatches",
        "1",
        "--eps-low",
        "0.2",
        "--eps-high",
        "0.28",
        "--optimizer",
        "adam",
        "--reward",
        "binary",
        "--sampler",
        "nonzero-uniform",
        "--warm-start-steps",
        "0",
        "--torch-threads",
        "4",
        "--eval-every",
        "100",
        "--eval-questions",
        "16",
    ]
    if args.lora:
        command.append("--lora")
    if args.max_minutes:
        command += ["--max-minutes", str(args.max_minutes)]
    return command + args.extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="Qwen/Qwen2.5-0.5B-Instruct", help="hub id, local directory, or smollm2-135m"
    )
    parser.add_argument("--configs", default=PAPER_CONFIGS)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--lora", action="store_true", help="LoRA instead of full fine-tuning (smaller cards)")
    parser.add_argument("--max-minutes", type=float, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "paper-scale")
    parser.add_argument("--dry-run", action="store_true", help="print the command and exit")
    args, args.extra = parser.parse_known_args(argv)
    command = paper_command(args)
    print("$ " + shlex.join(command), flush=True)
    if args.dry_run:
        return 0
    import torch

    if not torch.cuda.is_available():
        print("paper_scale.py: no CUDA device here; this run needs a GPU (see the docstring)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0)
    memory = torch.cuda.get_device_properties(0).total_memory / 2**30
    print(
        f"device: {name}, {memory:.0f} GiB; 8 nodes x {args.rounds} rounds x {len(args.configs.split(','))} arms "
        f"x {args.seeds} seed(s)",
        flush=True,
    )
    return subprocess.run(command, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
