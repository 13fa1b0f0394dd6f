"""`--shared-base`: a study's learners as LoRA adapters of one base model, their round's generation
one mixed batch, and the same rounds as if each node had generated alone."""

from __future__ import annotations

import json

import pytest
import trio

from sapo.node.cli import main
from sapo.node.core.round import generate_alone
from sapo.node.study.cli import experiment_node_settings
from sapo.node.study.nodes import build_run
from sapo.node.study.runs import run_lockstep
from sapo.node.study.settings import ExperimentSettings, parse_configs
from sapo.training.decoder import decoding

NODE_FLAGS = [
    "--model",
    "tiny",
    "--lora",
    "--lora-rank",
    "4",
    "--tasks",
    "basic_arithmetic",
    "--sampler",
    "uniform",
    "--max-new-tokens",
    "6",
    "--generations",
    "4",
    "--generation-precision",
    "fp32",
    "--lr",
    "1e-2",
]


def rounds_of(tmp_path, name: str, batched: bool, monkeypatch) -> tuple[list[dict], int]:
    # a scripted peer that is right half the time: external groups with signal, so the adapters train
    study = ExperimentSettings(
        nodes=3, configs=["2/2"], rounds=3, shared_base=True, scripted_solvers=1, out=tmp_path / name
    )
    base = experiment_node_settings(NODE_FLAGS)
    run = build_run(base, study, parse_configs(study.configs)[0], 0, tmp_path / name)
    assert len({id(learner.node.policy.model.shared) for learner in run.learners}) == 1  # one base in memory
    if not batched:
        run.generate = generate_alone
    calls = []
    real = decoding.decode_mixed
    monkeypatch.setattr(
        "sapo.training.completions.generation.decode_mixed", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    rows: list[dict] = []
    trio.run(
        run_lockstep,
        run,
        study.rounds,
        None,
        lambda r, results: rows.extend(
            x.record.model_dump(
                exclude={"generate_seconds", "train_seconds", "round_seconds", "cpu_seconds", "generate_cpu_seconds"}
            )
            for x in results
        ),
    )
    return rows, len(calls)


def test_a_shared_base_study_batches_generation_and_learns_as_each_node_alone(tmp_path, monkeypatch):
    batched, batches = rounds_of(tmp_path, "batched", True, monkeypatch)
    alone, no_batches = rounds_of(tmp_path, "alone", False, monkeypatch)
    assert batches == 3 and no_batches == 0  # one mixed batch a round, for all three nodes
    strip = lambda rows: [{k: v for k, v in r.items() if "second" not in k and k != "time"} for r in rows]  # noqa: E731
    differ = {k for a, b in zip(strip(batched), strip(alone)) for k in a if a[k] != b[k]}
    assert not differ and strip(batched) == strip(alone)
    assert sum(r["loss"] not in (None, 0.0) for r in batched) >= 3  # the adapters did train
    assert all(r["local_groups"] == 2 for r in batched)


def test_shared_base_needs_lora_and_one_model(tmp_path, capsys):
    assert main(["experiment", "--shared-base", "--rounds", "1", "--no-progress", "--out", str(tmp_path)]) == 2
    assert "add --lora" in capsys.readouterr().err
    with pytest.raises(ValueError, match="drop mixed_sizes"):
        ExperimentSettings(shared_base=True, mixed_sizes=True)


def test_the_cli_runs_a_shared_base_study(tmp_path):
    out = tmp_path / "study"
    assert (
        main(
            [
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
                *NODE_FLAGS,
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["study"]["shared_base"] is True and set(summary["results"]) == {"2/0", "1/1"}
