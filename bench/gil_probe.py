"""How long generation keeps other Python threads waiting for the GIL, with the CPU load held equal.

gossip_during_update.py times real gossip, so on a busy machine its latencies are mostly the
OS handing out CPU, and that moves from run to run. This probe separates the GIL's share: the
main thread sleeps 1 ms again and again and records how late it wakes, while a worker thread

- does nothing ("idle"),
- multiplies matrices back to back ("torch": the same one busy thread, but inside torch ops,
  which release the GIL, so the probe only ever waits for a CPU), or
- generates the round's completions back to back (`generate_groups`: the decoding loop and
  the verifier, which hold the GIL between torch ops).

The phases alternate `--cycles` times, so that a change in the machine's load hits all three.
Lateness beyond "torch" is the GIL's: what a trio loop, and the gossip it serves, waits for.

    .venv/bin/python bench/gil_probe.py                                  # tiny
    .venv/bin/python bench/gil_probe.py --model smollm2-135m --lora --switch-interval 0.001
    .venv/bin/python bench/gil_probe.py --smoke
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from pathlib import Path

from gossip_during_update import DEFAULT_MODELS_DIR, Trainer
from gossip_swarm import percentile
from text_table import print_rows

SLEEP_SECONDS = 0.001
PHASES = ("idle", "torch", "generate")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="policy: tiny (default), smollm2-135m, ...")
    parser.add_argument("--lora", action=argparse.BooleanOptionalAction, default=False, help="LoRA r=16 on the policy")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--questions", type=int, default=2, help="questions in the generated round")
    parser.add_argument("--generations", type=int, default=4, help="G: completions per question")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="generation cap per completion")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    parser.add_argument("--cycles", type=int, default=3, help="idle / torch / generate rounds")
    parser.add_argument(
        "--switch-interval", type=float, default=None, help="sys.setswitchinterval, seconds (default 0.005)"
    )
    parser.add_argument("--seed", type=int, default=0, help="model, task and sampling seed")
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR, help="converted-model cache")
    parser.add_argument("--smoke", action="store_true", help="tiny, one short cycle")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.lora, args.seconds, args.cycles, args.max_new_tokens = "tiny", False, 1.0, 1, 16
    args.force_signal, args.precision = False, "auto"  # Trainer's update options; nothing is trained here
    return args


def busy_torch(stop: threading.Event) -> None:
    import torch

    a = torch.randn(384, 384)
    while not stop.is_set():
        a = torch.mm(a, a).div_(a.norm())  # about 3 ms of GIL-free work a call, one line of Python


def busy_generate(trainer: Trainer, args: argparse.Namespace, stop: threading.Event) -> None:
    while not stop.is_set():
        trainer.generate(args)


def probe(seconds: float) -> list[float]:
    """Lateness of 1 ms sleeps, for `seconds`."""
    late = []
    end = time.perf_counter() + seconds
    while (now := time.perf_counter()) < end:
        time.sleep(SLEEP_SECONDS)
        late.append(time.perf_counter() - now - SLEEP_SECONDS)
    return late


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    trainer = Trainer.load(args)
    trainer.generate(args)  # warm-up: first calls pay one-off costs
    lateness: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _ in range(args.cycles):
        for phase in PHASES:
            stop = threading.Event()
            work = {
                "idle": None,
                "torch": lambda: busy_torch(stop),
                "generate": lambda: busy_generate(trainer, args, stop),
            }[phase]
            worker = threading.Thread(target=work) if work else None
            if worker:
                worker.start()
            lateness[phase] += probe(args.seconds)
            stop.set()
            if worker:
                worker.join()
    ms = lambda values, q: f"{1e3 * percentile(values, q):.2f}"  # noqa: E731
    print(
        f"GIL probe: 1 ms sleeps in the main thread while a worker thread is idle, in torch ops, or generating; "
        f"model {args.model}{' LoRA' if args.lora else ''}, {args.questions} x {args.generations} x up to "
        f"{args.max_new_tokens} tokens, torch threads {args.threads}, GIL switch interval "
        f"{1e3 * sys.getswitchinterval():g} ms, {args.cycles} x 3 phases of {args.seconds:g} s"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, load average "
        f"{os.getloadavg()[0]:.2f} at the end (CONTENDED when above about 0.5)"
    )
    rows = [["phase", "wake-ups", "late p50 ms", "late p90 ms", "late p99 ms", "late max ms"]]
    for phase, values in lateness.items():
        rows.append([phase, str(len(values)), ms(values, 50), ms(values, 90), ms(values, 99), ms(values, 100)])
    print_rows(rows)
    extra = percentile(lateness["generate"], 99) - percentile(lateness["torch"], 99)
    print(
        f"p99 lateness, generate minus torch (the GIL's share): {1e3 * extra:.2f} ms; "
        f"ratio generate / torch: {percentile(lateness['generate'], 99) / percentile(lateness['torch'], 99):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
