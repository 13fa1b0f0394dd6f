"""The GPU check's outputs (bench/gpu_check.py): the machine it ran on and the files a GPU box hands back.

At most 8 files, each under the device's limit: summary.md, summary.json, raw.jsonl (every
part's rows), logs.tar.gz (each part's output and the study's folder) and the study's curves.png.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import asdict
from pathlib import Path

from bench.gpu_check_parts import Outcome, Setup

MAX_FILE_BYTES = 16 * 2**20  # the device's limit on each file handed back
MAX_LOGGED_BYTES = 4 * 2**20  # a file larger than this (a checkpoint, say) stays out of logs.tar.gz


MACHINE = """
import json, os, platform, torch, transformers
info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "cpus": os.cpu_count(), "cuda": torch.cuda.is_available()}
if info["cuda"]:
    p = torch.cuda.get_device_properties(0)
    info |= {"card": torch.cuda.get_device_name(0), "gpu_memory_gib": p.total_memory / 2**30,
             "multiprocessors": p.multi_processor_count, "capability": f"{p.major}.{p.minor}",
             "cuda_runtime": torch.version.cuda, "bf16": torch.cuda.is_bf16_supported()}
print(json.dumps(info))
"""


def machine_info(setup: Setup) -> dict:
    try:
        child = subprocess.run(
            [setup.python, "-c", MACHINE], capture_output=True, text=True, env=setup.env, timeout=120
        )
        info = (
            json.loads(child.stdout.strip().splitlines()[-1])
            if child.returncode == 0
            else {"error": child.stderr[-500:]}
        )
    except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as error:
        info = {"error": str(error)}
    if shutil.which("nvidia-smi"):  # read only: the card's settings are left as they are
        query = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["nvidia_smi"] = query.stdout.strip()
    return info


def card_slug(info: dict, rehearsal: bool) -> str:
    name = info.get("card") or ("cpu-rehearsal" if rehearsal else "cpu")
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def write_outputs(out: Path, work: Path, outcomes: list[Outcome], info: dict, args, wall: float) -> list[Path]:
    slug = card_slug(info, args.rehearsal)
    summary = {
        "card": slug,
        "machine": info,
        "command": sys.argv,
        "rehearsal": args.rehearsal,
        "device": args.device,
        "minutes_budget": args.minutes,
        "wall_seconds": wall,
        "task": args.task,
        "task_config": args.task_config,
        "parts": [{k: v for k, v in asdict(o).items() if k != "rows"} | {"rows": len(o.rows)} for o in outcomes],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    with (out / "raw.jsonl").open("w") as raw:
        for o in outcomes:
            for row in o.rows:
                raw.write(json.dumps({"part": o.part, **row}) + "\n")
    lines = [
        f"# GPU check: {info.get('card', 'no GPU')} ({'rehearsal, ' if args.rehearsal else ''}{args.device})",
        "",
        f"`{' '.join(sys.argv)}`, {wall / 60:.1f} of {args.minutes} minutes. "
        f"torch {info.get('torch')}, transformers {info.get('transformers')}, python {info.get('python')}, "
        f"{info.get('cpus')} CPUs" + (f"; {info['nvidia_smi']}" if info.get("nvidia_smi") else "") + ".",
        f"File it under `bench/results/gpu/{slug}/`.",
        "",
        "| part | status | seconds | result |",
        "|---|---|---|---|",
    ]
    lines += [f"| {o.part} | {o.status} | {o.seconds:.0f} | {o.headline} |" for o in outcomes]
    for o in outcomes:
        if o.detail:
            lines += ["", f"## {o.part}", "", "```", o.detail, "```"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    study_plot = work / "study" / "curves.png"
    if study_plot.exists():
        shutil.copy(study_plot, out / "curves.png")
    left_out = []

    def small(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if member.size > MAX_LOGGED_BYTES:
            left_out.append(f"{member.name} ({member.size} bytes)")
            return None
        return member

    with tarfile.open(out / "logs.tar.gz", "w:gz") as archive:
        for path in sorted(work.glob("*.log")) + [work / "tests.xml", work / "study"]:
            if path.exists():
                archive.add(path, arcname=path.name, filter=small)
    if left_out:
        with (out / "summary.md").open("a") as md:
            md.write("\nLeft out of logs.tar.gz for size: " + ", ".join(left_out) + "\n")
    written = sorted(p for p in out.iterdir() if p.is_file())
    for path in written:
        if path.stat().st_size > MAX_FILE_BYTES:  # a log cannot be handed back above the limit: say so
            path.write_text(f"{path.name} was {path.stat().st_size} bytes, over the {MAX_FILE_BYTES}-byte limit\n")
    return written
