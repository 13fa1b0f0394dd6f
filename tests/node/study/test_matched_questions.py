"""Matched questions (issue #39): in a study every (seed, node, round) draws one list of
questions and an arm with I local questions asks its first I, so arms differ only by what they
are designed to differ by; and --slices' specialists, each asking its own slice, held out on all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sapo.node.cli import main
from sapo.node.core.settings import SettingsError
from sapo.node.study.cli import experiment_node_settings
from sapo.node.study.nodes import node_settings, slice_heldout
from sapo.node.study.settings import ExperimentSettings, parse_configs

STUDY = [
    "experiment",
    "--nodes",
    "2",
    "--rounds",
    "5",
    "--seeds",
    "2",
    "--no-progress",
    "--jobs",
    "1",
    "--tasks",
    "basic_arithmetic",
    "--max-new-tokens",
    "4",
    "--generations",
    "2",
    "--warm-start-steps",
    "0",
    "--eval-every",
    "5",
    "--eval-questions",
    "3",
    "--eval-samples",
    "2",
]


def _asked(out: Path) -> dict[tuple[str, int, int, int], list[str]]:
    rows = [json.loads(line) for line in (out / "raw.jsonl").read_text().splitlines()]
    return {(r["config"], r["seed"], r["node"], r["round"]): r["asked"] for r in rows}


@pytest.fixture(scope="module")
def arms(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("matched")
    assert main([*STUDY, "--configs", "4/0,2/2,adaptive,1/3", "--out", str(out)]) == 0
    return _asked(out), out


def test_every_arm_asks_the_first_questions_of_the_same_list_each_round(arms):
    asked, _ = arms
    keys = [k for k in asked if k[0] == "4/0"]
    assert len(keys) == 2 * 2 * 5  # seeds x nodes x rounds
    for _, seed, node, round_index in keys:
        full = asked[("4/0", seed, node, round_index)]
        assert len(full) == 4
        assert asked[("2/2", seed, node, round_index)] == full[:2]
        assert asked[("1/3", seed, node, round_index)] == full[:1]
        adaptive = asked[("adaptive", seed, node, round_index)]
        assert adaptive == full[: len(adaptive)] and adaptive
    # the list moves on by all four every round, whatever an arm asks of it: 2/2's round 2 asks
    # the stream's questions 4 and 5 (unmatched, it would ask 2 and 3, which 4/0 asked in round 1)
    assert asked[("2/2", 0, 0, 2)] == ["basic_arithmetic#4", "basic_arithmetic#5"]
    rows = [json.loads(line) for line in (arms[1] / "raw.jsonl").read_text().splitlines()]
    assert all(r["heldout_sampled"] is not None for r in rows if r["round"] == 5)


def test_the_summary_pairs_sampled_held_out_accuracy(arms):
    _, out = arms
    summary = json.loads((out / "summary.json").read_text())
    entry = summary["results"]["2/2"]
    assert "heldout_sampled_last" in entry
    assert entry["ratio_to_baseline"]["heldout_sampled_last_difference"]["seeds"] == 2
    assert "## Held-out accuracy, paired: sampled" in (out / "summary.md").read_text()


def test_draw_questions_must_cover_what_a_round_asks(tmp_path):
    base = experiment_node_settings(["--tasks", "basic_arithmetic"])
    with pytest.raises(SettingsError, match="--draw-questions 3 is fewer than the 4 local questions"):
        base.updated({"local": 4, "external": 0, "balance": "fixed", "draw_questions": 3})
    with pytest.raises(SettingsError, match="I \\+ J with an adaptive balance"):
        base.updated({"local": 2, "external": 2, "balance": "adaptive", "draw_questions": 3})
    study = ExperimentSettings(configs=["8/0", "2/2"], out=tmp_path)
    assert study.questions_per_round == 8
    settings = node_settings(base, study, parse_configs(study.configs)[1], 0, 0, tmp_path)
    assert settings.run.draw_questions == 8 and settings.sampling.local == 2


SLICES = '[{"operators": ["+"]}, {"operators": ["-"]}, {"operators": ["*"]}]'


def test_slices_train_each_node_on_its_own_slice_and_hold_out_all(tmp_path):
    out = tmp_path / "slices"
    assert main([*STUDY, "--nodes", "3", "--seeds", "1", "--rounds", "2", "--eval-every", "2",
                 "--configs", "2/0", "--slices", SLICES, "--out", str(out)]) == 0  # fmt: skip
    study = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "raw.jsonl").read_text().splitlines()]
    for node, operator in enumerate("+-*"):
        finals = [r for r in rows if r["node"] == node and r["round"] == 2]
        assert len(finals) == 1 and len(finals[0]["heldout"]) == 3  # every slice held out
        assert any(operator in label for label in finals[0]["heldout"])
    assert study["study"]["slices"] == json.loads(SLICES)
    base = experiment_node_settings(["--tasks", "basic_arithmetic", "--eval-questions", "4"])
    sliced = ExperimentSettings(nodes=4, configs=["2/0"], slices=json.loads(SLICES), out=tmp_path)
    for node, operator in enumerate("+-*+"):  # node k asks slice k mod 3, and only it
        settings = node_settings(base, sliced, parse_configs(sliced.configs)[0], 0, node, tmp_path)
        assert settings.tasks.specs()[0].config["operators"] == [operator]
    heldout = slice_heldout(base, sliced)
    assert [len(problems) for problems in heldout.values()] == [4, 4, 4]
    for label, problems in heldout.items():
        operator = json.loads(label.split(" ", 1)[1])["operators"][0]
        assert all(f" {operator} " in p.question for p in problems), label


def test_slices_are_checked_before_any_model_loads(tmp_path, capsys):
    two_tasks = [
        *STUDY,
        "--tasks",
        "basic_arithmetic,bf",
        "--configs",
        "2/0",
        "--slices",
        SLICES,
        "--out",
        str(tmp_path),
    ]
    assert main(two_tasks) == 2
    assert "--slices splits one task" in capsys.readouterr().err
    assert main([*STUDY, "--configs", "2/0", "--slices", "[{", "--out", str(tmp_path)]) == 2
    assert "--slices is not JSON" in capsys.readouterr().err
    refused = [*STUDY, "--configs", "2/0", "--slices", '[{"max_digits": 99}, {}]', "--out", str(tmp_path)]
    assert main(refused) == 2
    assert "peers accept only" in capsys.readouterr().err
