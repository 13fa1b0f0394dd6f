"""`sapo-node` on a CUDA GPU, through the real CLI: a node trains there, checkpoints, resumes there
and on a CPU-only machine; a shared-base study runs there. Marked `cuda`, skipped without a GPU
(bench/gpu_check.py runs them on a GPU box)."""

import json

import pytest
import torch

from tests.support.processes import FAST_TINY, read_metrics, sapo_node

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_node_trains_on_cuda_and_its_checkpoint_resumes_on_cuda_and_on_the_cpu(tmp_path):
    data = tmp_path / "node"
    args = [*FAST_TINY, "--checkpoint-every", "1", "--data-dir", str(data)]
    first = sapo_node("start", *args, "--device", "cuda", "--rounds", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert [r["round"] for r in read_metrics(data)] == [1, 2]
    again = sapo_node("start", *args, "--device", "cuda", "--rounds", "3")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr and "at round 2" in again.stderr
    # a checkpoint written on a GPU (optimizer state included) must load where there is none
    on_cpu = sapo_node("start", *args, "--device", "cpu", "--rounds", "4")
    assert on_cpu.returncode == 0, on_cpu.stderr[-3000:]
    assert "at round 3" in on_cpu.stderr
    assert [r["round"] for r in read_metrics(data)] == [1, 2, 3, 4]


def test_a_shared_base_lora_study_runs_on_cuda(tmp_path):
    out = tmp_path / "study"
    result = sapo_node(
        "experiment",
        "--nodes",
        "2",
        "--configs",
        "2/0,1/1",
        "--rounds",
        "2",
        "--shared-base",
        "--no-progress",
        "--jobs",
        "1",
        "--out",
        str(out),
        "--model",
        "tiny",
        "--lora",
        "--lora-rank",
        "4",
        "--tasks",
        "basic_arithmetic",
        "--max-new-tokens",
        "6",
        "--generations",
        "4",
        "--device",
        "cuda",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["study"]["shared_base"] is True and set(summary["results"]) == {"2/0", "1/1"}
