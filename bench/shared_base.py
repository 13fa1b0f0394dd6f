"""N LoRA nodes on one machine: one process with one base model and a mixed batch, against N
processes with a base model each. Prints seconds of generation per swarm-round and peak memory.

Every node generates the same round a node does (--questions questions x --generations samples,
its own ReasoningGYM questions, chat prompts, its own sampling seed), with LoRA r=16 on the base:

- `separate`: N processes, each loading the base and its adapter and decoding its round, all at
  once (as N `sapo-node start --lora` on one machine would), one torch thread each;
- `shared, one by one`: one process, one base (training/models/shared_base.py), each node decoding its
  round in turn through its own adapter;
- `shared, mixed batch`: the same process, all N rounds as one batch through the base weights,
  each row with its node's adapter (decoding.decode_mixed).

Memory is the peak of the summed resident set of the processes of a mode, sampled every 50 ms;
on a GPU (`--device cuda`) it is the device's memory in use (NVML, the CUDA contexts included)
above what was in use before the mode started, and each process's own peak reserved by torch.

    .venv/bin/python -m bench.shared_base                      # 8 x smollm2-135m, about 10 minutes on 2 cores
    .venv/bin/python -m bench.shared_base --smoke                # 2 x tiny
    python -m bench.shared_base --device cuda                    # on a GPU (bench/gpu_check.py)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from bench.shared_base_report import Measured, gpu_reserved, json_records, modes_of, print_header, print_table

BENCH = Path(__file__).resolve().parent
DEFAULT_MODELS_DIR = BENCH / ".cache" / "models"
RESULT_MARKER = "RESULT "


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="smollm2-135m", help="base model: smollm2-135m (default), tiny, a local path"
    )
    parser.add_argument("--nodes", type=int, default=8, help="LoRA nodes on the machine")
    parser.add_argument("--questions", type=int, default=4, help="questions per node-round (I)")
    parser.add_argument("--generations", type=int, default=8, help="G: completions per question")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="generation cap per completion")
    parser.add_argument("--rounds", type=int, default=2, help="timed swarm-rounds per mode, after one untimed")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of the shared process")
    parser.add_argument("--generation-precision", default="auto", choices=("auto", "fp32", "bf16"))
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR, help="converted-model cache")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where every process decodes")
    parser.add_argument("--json", type=Path, default=None, help="also write one JSON row per mode here")
    parser.add_argument("--smoke", action="store_true", help="one short round per mode")
    parser.add_argument("--worker", choices=("separate", "shared"), help=argparse.SUPPRESS)
    parser.add_argument("--node", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        # fp32: a mixed batch then samples token for token what each node samples alone
        args.model, args.nodes, args.generation_precision = "tiny", min(args.nodes, 2), "fp32"
        args.rounds, args.questions, args.generations, args.max_new_tokens = 1, 2, 4, 12
    return args


def node_prompts(policy, node: int, round_index: int, questions: int) -> list[str]:
    from sapo.training.problems.tasks import TaskSampler, default_task_specs

    tasks = TaskSampler(default_task_specs(), dataset_seed=node, rng_seed=node * 1000 + round_index)
    return [policy.prompt(problem) for problem in tasks.sample(questions)]


def decode_options(args, policy) -> dict:
    return dict(
        samples_per_prompt=args.generations,
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        device=policy.device,
        stop_text="</answer>",
        weights_dtype=policy.generation_dtype,
    )


def run_separate(args) -> dict:
    """One node alone: its own base and adapter, one thread, its rounds' generation times."""
    import torch

    from sapo.training.decoder.decoding import decode_samples
    from sapo.training.models.policy import LoraOptions, load_policy

    torch.set_num_threads(1)
    # seed 0: the base the shared process builds (a tiny model is made from its seed)
    policy = load_policy(
        args.model,
        device=args.device,
        lora=LoraOptions(16, 32),
        seed=0,
        models_dir=args.models_dir,
        generation_precision=args.generation_precision,
    )
    seconds, tokens = [], 0
    for round_index in range(args.rounds + 1):
        prompts = node_prompts(policy, args.node, round_index, args.questions)
        print("READY", flush=True)
        sys.stdin.readline()  # every node starts the round at once, as a swarm's do
        started = time.perf_counter()
        batch = decode_samples(
            policy.model, policy.tokenizer, prompts, seed=round_index, **decode_options(args, policy)
        )
        synchronize(policy.device)
        seconds.append(time.perf_counter() - started)
        tokens += batch.new_tokens if round_index else 0
        print("DONE", flush=True)
    return {"seconds": seconds[1:], "tokens": tokens, "torch_reserved": torch_reserved(policy.device)}


def run_shared(args) -> dict:
    """All nodes on one base: each round decoded one node at a time, then as one mixed batch."""
    import torch

    from sapo.training.decoder.decoding import decode_mixed, decode_samples
    from sapo.training.models.policy import LoraOptions
    from sapo.training.models.shared_base import SharedLoraBase

    torch.set_num_threads(args.threads)
    shared = SharedLoraBase(
        args.model,
        args.nodes,
        lora=LoraOptions(16, 32),
        seeds=list(range(args.nodes)),
        models_dir=args.models_dir,
        device=args.device,
        generation_precision=args.generation_precision,
    )
    policies = [shared.policy(k) for k in range(args.nodes)]
    one_by_one, mixed, tokens = [], [], {"one_by_one": 0, "mixed": 0}
    for round_index in range(args.rounds + 1):
        prompts = [node_prompts(p, k, round_index, args.questions) for k, p in enumerate(policies)]
        options = decode_options(args, policies[0])
        started = time.perf_counter()
        alone = [
            decode_samples(p.model, p.tokenizer, prompts[k], seed=round_index, **options)
            for k, p in enumerate(policies)
        ]
        synchronize(policies[0].device)
        one_by_one.append(time.perf_counter() - started)
        started = time.perf_counter()
        together = decode_mixed(
            shared.model,
            shared.tokenizer,
            prompts,
            [v.name for v in shared.views],
            seeds=[round_index] * args.nodes,
            **options,
        )
        synchronize(policies[0].device)
        mixed.append(time.perf_counter() - started)
        if round_index:
            tokens["one_by_one"] += sum(b.new_tokens for b in alone)
            tokens["mixed"] += sum(b.new_tokens for b in together)
    return {
        "one_by_one": one_by_one[1:],
        "mixed": mixed[1:],
        "tokens": tokens,
        "torch_reserved": torch_reserved(policies[0].device),
    }


def synchronize(device) -> None:
    """Wait for the device's queued work, so that a wall-clock reading includes it."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def torch_reserved(device) -> int | None:
    """The most device memory torch's allocator held in this process (no CUDA context), or None on a CPU."""
    import torch

    return torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None


class PeakMemory:
    """The peak of the summed RSS of some processes (and their children), sampled every 50 ms;
    with `gpu` (an NVML device index), also the peak of the device's memory in use above `gpu_baseline`."""

    def __init__(self, processes: list[subprocess.Popen], gpu: int | None = None, gpu_baseline: int = 0):
        self.processes = [psutil.Process(p.pid) for p in processes]
        self.peak = 0
        self.gpu_peak = 0
        self.gpu = None if gpu is None else nvml_handle(gpu)
        self.gpu_baseline = gpu_baseline
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.is_set():
            total = 0
            for process in self.processes:
                try:
                    total += process.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            if self.gpu is not None:
                self.gpu_peak = max(self.gpu_peak, gpu_used(self.gpu) - self.gpu_baseline)
            time.sleep(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def nvml_handle(index: int):
    import pynvml  # nvidia-ml-py: comes with torch's CUDA builds

    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def gpu_used(handle) -> int:
    import pynvml

    return pynvml.nvmlDeviceGetMemoryInfo(handle).used


def nvml_works(index: int) -> bool:
    try:
        gpu_used(nvml_handle(index))
        return True
    except Exception:  # noqa: BLE001 - no NVML (a sandbox without it): torch's own figure stands in
        return False


def gpu_index(device: str) -> int | None:
    """The NVML index of a cuda device name, None for the CPU."""
    if not device.startswith("cuda"):
        return None
    return int(device.partition(":")[2] or 0)


def spawn(args, worker: str, node: int = 0) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "bench.shared_base",
        "--worker",
        worker,
        "--node",
        str(node),
        "--model",
        args.model,
        "--nodes",
        str(args.nodes),
        "--questions",
        str(args.questions),
        "--generations",
        str(args.generations),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--rounds",
        str(args.rounds),
        "--threads",
        str(args.threads),
        "--generation-precision",
        args.generation_precision,
        "--models-dir",
        str(args.models_dir),
        "--device",
        args.device,
    ]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=BENCH.parent)


def wait_for(process: subprocess.Popen, word: str) -> None:
    while line := process.stdout.readline():  # readline, not iteration: no read-ahead past the line
        if line.strip() == word:
            return
    raise RuntimeError(f"worker exited (code {process.wait()}) before saying {word}")


def swarm_rounds(args, workers: list[subprocess.Popen]) -> list[float]:
    """Each round: wait until every node is ready, start them together, time until the last is done."""
    seconds = []
    for _ in range(args.rounds + 1):
        for worker in workers:
            wait_for(worker, "READY")
        started = time.perf_counter()
        for worker in workers:
            worker.stdin.write("go\n")
            worker.stdin.flush()
        for worker in workers:
            wait_for(worker, "DONE")
        seconds.append(time.perf_counter() - started)
    return seconds[1:]


def result_of(process: subprocess.Popen) -> dict:
    process.stdin.close()
    out = process.stdout.read()  # not communicate(): it would skip what readline() has buffered
    if process.wait() != 0:
        raise RuntimeError(f"worker failed with exit code {process.returncode}")
    return json.loads(next(line for line in out.splitlines() if line.startswith(RESULT_MARKER))[len(RESULT_MARKER) :])


def measure_separate(args, sampled: int | None) -> tuple[list[float], list[dict], PeakMemory, float]:
    """N worker processes, a node each, decoding their rounds at once: the swarm-rounds' seconds,
    each worker's result, their memory, and the wall time of it all."""
    baseline = gpu_used(nvml_handle(sampled)) if sampled is not None else 0  # what others hold on the card
    started = time.perf_counter()
    workers = [spawn(args, "separate", k) for k in range(args.nodes)]
    with PeakMemory(workers, sampled, baseline) as memory:
        rounds = swarm_rounds(args, workers)
        results = [result_of(w) for w in workers]
    return rounds, results, memory, time.perf_counter() - started


def measure_shared(args, sampled: int | None) -> tuple[dict, PeakMemory]:
    """One worker process with every node on its one base: its result and its memory."""
    baseline = gpu_used(nvml_handle(sampled)) if sampled is not None else 0
    worker = spawn(args, "shared")
    with PeakMemory([worker], sampled, baseline) as memory:
        result = result_of(worker)
    return result, memory


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        result = run_separate(args) if args.worker == "separate" else run_shared(args)
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return 0
    args.models_dir.mkdir(parents=True, exist_ok=True)
    if args.model == "smollm2-135m":  # convert the GGUF once, before anything is timed
        from sapo.training.models.smollm2 import load_smollm2

        load_smollm2(args.models_dir / "smollm2-135m")
    gpu = gpu_index(args.device)
    sampled = gpu if gpu is not None and nvml_works(gpu) else None  # the card's memory, CUDA contexts included
    separate_rounds, separate, separate_memory, separate_wall = measure_separate(args, sampled)
    shared, shared_memory = measure_shared(args, sampled)
    measured = Measured(separate_rounds, separate, separate_memory, separate_wall, shared, shared_memory)
    modes = modes_of(args, measured)
    print_header(args, separate_wall)
    reserved = gpu_reserved(measured, sampled) if gpu is not None else None
    print_table(measured, modes, reserved)
    if args.json:
        records = json_records(args, measured, modes, reserved, sampled)
        args.json.write_text("".join(json.dumps(r) + "\n" for r in records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
