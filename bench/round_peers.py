"""The peer frameworks' arms of the round benchmark (bench/round.py): genrl 0.1.11, genrl 0.3.0, TRL.

Each runs in its own venv (`bash bench/peer_bench/setup.sh` makes them in bench/peers/) and child
process, through its adapter in bench/peer_bench/, on the job that sapo's arm wrote: the same
model directory, prompts, G, cap, LoRA, lr, seed and threads. A peer that is not installed or
fails gives the reason, never a row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.peer_bench.common import RESULT_MARKER as PEER_RESULT_MARKER

BENCH = Path(__file__).resolve().parent
DEFAULT_PEERS_DIR = BENCH / "peers"
# peer name -> its adapter in bench/peer_bench/, run with bench/peers/<name>/bin/python
PEERS = {"genrl": "genrl_round.py", "genrl-0.3": "genrl_round.py", "trl": "trl_round.py"}


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


def indent(text: str) -> str:
    return "\n".join("      " + line for line in text.splitlines())
