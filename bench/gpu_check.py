"""One prepared check for a short, offline GPU box: the CUDA path end to end in about 10 minutes.

    python3 -m bench.gpu_check --bundle .gpu/t3 --out $OUT          # on the box (bench/gpu_bundle.sh prints it)
    .venv/bin/python -m bench.gpu_check --device cpu --rehearsal --out /tmp/gpu-rehearsal   # here, tiny models

Every part runs the product's own code through its command line, in a child process with its
own time budget; a part that fails or runs out of time is recorded and the next one starts:

    prepare   (--bundle) the GGUF reassembled from the transfers' parts and checked, the wheels and
              sapo installed into a site folder, SmolLM2 converted once (bench/gpu_bundle.sh)
    tests     pytest -m cuda: the CUDA-marked tests
    round     bench/round.py at bf16 on the GPU, beside plain transformers generate (--hf-generate)
    roofline  bench/roofline.py: decode tokens/s at batch 32 and 256 against the card's bf16 roof
    shared    bench/shared_base.py: 8 LoRA nodes on one base as one mixed batch against 8 separate
              models (goal: >= 3x the speed in <= 1/4 of the memory)
    study     sapo-node experiment --shared-base: 8 SmolLM2 LoRA nodes, 8/0 against 4/4 on one task,
              stopped by --max-minutes at what is left of --minutes

It writes at most 8 files to --out (what a GPU box hands back): summary.md, summary.json,
raw.jsonl (every part's rows, each with its part), logs.tar.gz (each part's output and the
study's folder) and the study's curves.png; and prints a one-line summary last.

With --rehearsal the same parts run with tiny models and tiny budgets (on a CPU: the CUDA tests
skip), so that the script is known to run in one go before a GPU is lent. The top of this file
uses the standard library alone: on the box, sapo and its dependencies exist only after prepare.

This file is the command line and the run; the parts' commands and readers are in
bench/gpu_check_parts.py, prepare in bench/gpu_check_prepare.py, the outputs in
bench/gpu_check_outputs.py (each of them the standard library alone at the top too).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from bench.gpu_check_outputs import card_slug, machine_info, write_outputs
from bench.gpu_check_parts import (
    BENCH,
    COMMANDS,
    READERS,
    REAL,
    REHEARSAL,
    Outcome,
    Setup,
    run_logged,
    study_command,
    study_outcome,
)
from bench.gpu_check_prepare import prepare

PARTS = ("prepare", "tests", "round", "roofline", "shared", "study")
REHEARSAL_TESTS = "tests/training/test_cuda.py,tests/node/daemon/test_cuda_node.py"
# Where SmolLM2 starts low but can learn (bench/start_accuracy.py on the CPU, bench/README.md): at the
# easy settings every other task scored 0 (no group to learn from) and basic_arithmetic 0.46 sampled;
# with operands up to 2 digits it starts at 0.47 greedy, 0.09 sampled, 6 of 16 groups mixed
# (bench/results/smollm2-study/start-accuracy.jsonl).
STUDY_TASK = "basic_arithmetic"
STUDY_TASK_CONFIG = '{"basic_arithmetic": {"max_digits": 2}}'


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the results (on the box: $OUT)")
    parser.add_argument("--device", default="cuda", help="cuda (the box), cuda:N, or cpu (a rehearsal)")
    parser.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="the whole check's budget (default: 9, inside the device's 10 minutes a command; rehearsal 8)",
    )
    parser.add_argument(
        "--rehearsal", action="store_true", help="tiny models and tiny budgets: the script runs in one go"
    )
    parser.add_argument(
        "--bundle",
        type=Path,
        default=None,
        help="the last transfer's folder (bench/gpu_bundle.sh): install it first; without it, use "
        "this interpreter's sapo as it is",
    )
    parser.add_argument(
        "--parts",
        type=Path,
        default=Path("/var/tmp/sapo-gpu/parts"),
        help="where the earlier transfers' commands left their GGUF parts",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="scratch folder: the bundle's site, the converted model, this run's files in run/ "
        "(default: /var/tmp/sapo-gpu, or a folder beside --out in a rehearsal)",
    )
    parser.add_argument("--only", default=",".join(PARTS[1:]), help=f"parts to run, of {', '.join(PARTS[1:])}")
    parser.add_argument("--task", default=STUDY_TASK, help="the study's ReasoningGYM task")
    parser.add_argument("--task-config", default=STUDY_TASK_CONFIG, help="its settings over the easy ones (JSON)")
    parser.add_argument(
        "--tests",
        default=None,
        help="comma-separated test paths for `pytest -m cuda` (default: tests; in a rehearsal the CUDA "
        "tests' own files, which skip on a CPU, without collecting the whole suite)",
    )
    args = parser.parse_args(argv)
    args.budget = REHEARSAL if args.rehearsal else REAL
    args.minutes = args.minutes or (8.0 if args.rehearsal else 9.0)
    args.tests = args.tests or (REHEARSAL_TESTS if args.rehearsal else "tests")
    args.only_parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(args.only_parts) - set(PARTS[1:]))
    if unknown:
        parser.error(f"--only: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS[1:])}")
    if args.bundle is not None and not (args.bundle / "manifest.json").is_file():
        parser.error(
            f"--bundle {args.bundle}: no manifest.json there; give the last transfer's folder "
            "(bench/gpu_bundle.sh prints it)"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    deadline = started + args.minutes * 60
    args.out.mkdir(parents=True, exist_ok=True)
    home = args.work or (args.out.parent / f".{args.out.name}-work" if args.rehearsal else Path("/var/tmp/sapo-gpu"))
    work = home / "run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "MPLBACKEND": "Agg",
    }
    if args.bundle is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(home / "site"), os.environ.get("PYTHONPATH")]))
    tiny = args.rehearsal
    setup = Setup(
        sys.executable,
        env,
        work,
        home / "site",
        home / "models",
        "tiny" if tiny else "smollm2-135m",
        "tiny-micro" if tiny else "smollm2-135m",
    )
    if args.bundle is None and not tiny:
        setup.models_dir = BENCH / ".cache" / "models"  # this interpreter's own SmolLM2 cache

    outcomes: list[Outcome] = []
    if args.bundle is not None:
        outcome = prepare(args, setup, work / "prepare.log")
        outcomes.append(outcome)
        print(f"[gpu_check] prepare: {outcome.status} in {outcome.seconds:.0f} s: {outcome.headline}", flush=True)
        if outcome.status != "ok":
            setup.notes.append("prepare failed: the parts below run on whatever this interpreter has")
    info = machine_info(setup)
    for part in args.only_parts:
        log = work / f"{part}.log"
        left = deadline - time.perf_counter()
        if part == "study":
            minutes = (left - args.budget.study_reserve) / 60
            if setup.study_model is None or left < args.budget.study_min:
                why = "no real weights to learn with" if setup.study_model is None else f"only {left:.0f} s left"
                outcomes.append(Outcome(part, "skipped", 0, why, why))
            else:
                status, seconds = run_logged(study_command(args, setup, minutes), log, left - 10, env)
                outcomes.append(study_outcome(setup, status, seconds, log))
        else:
            timeout = min(getattr(args.budget, part), max(left - 10, 1))
            status, seconds = run_logged(COMMANDS[part](args, setup), log, timeout, env)
            outcomes.append(READERS[part](setup, status, seconds, log))
        o = outcomes[-1]
        print(f"[gpu_check] {part}: {o.status} in {o.seconds:.0f} s: {o.headline}", flush=True)
    wall = time.perf_counter() - started
    written = write_outputs(args.out, work, outcomes, info, args, wall)
    print(f"[gpu_check] wrote {', '.join(p.name for p in written)} to {args.out}", flush=True)
    print(
        f"gpu_check {card_slug(info, args.rehearsal)}: "
        + " | ".join(f"{o.part} {o.status}" for o in outcomes)
        + f" | {wall / 60:.1f} min",
        flush=True,
    )
    return 0 if all(o.status in ("ok", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
