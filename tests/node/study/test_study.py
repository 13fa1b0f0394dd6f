"""The in-process I/J study: deterministic, mixes exactly I + J, writes its outputs; and its parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sapo.node.cli import main
from sapo.node.core.settings import load_settings
from sapo.node.study.metrics import (
    best_isolated,
    curve_metrics,
    moving_average,
    paired_heldout,
    paired_interval,
    paired_ratios,
    per_model_results,
    spread_metrics,
)
from sapo.node.study.nodes import node_model, specialist_tasks
from sapo.node.study.run_timing import cpu_hours
from sapo.node.study.settings import TREATMENTS, ExperimentSettings, parse_configs
from sapo.node.study.summary_markdown import best_isolated_lines, heldout_lines, per_model_lines
from sapo.training.problems.tasks import default_task_specs

STUDY = [
    "experiment",
    "--nodes",
    "2",
    "--configs",
    "8/0,4/4",
    "--rounds",
    "4",
    "--seeds",
    "1",
    "--scripted-solvers",
    "1",
    "--solver-accuracy",
    "0.5",
    "--no-progress",
    # node settings, passed through
    "--tasks",
    "basic_arithmetic",
    "--sampler",
    "uniform",
    "--max-new-tokens",
    "6",
    "--generations",
    "4",
    "--warm-start-steps",
    "0",
    # the untrained model's groups all score 0: kept only by a node that adds its own completions
    "--augment-external",
    "1",
]


@pytest.fixture(scope="module")
def two_studies(tmp_path_factory) -> tuple[Path, Path]:
    outs = []
    # b runs its two configs in two worker processes: the same results in any process
    for name, jobs in (("a", "1"), ("b", "2")):
        out = tmp_path_factory.mktemp(name)
        assert main([*STUDY, "--out", str(out), "--jobs", jobs]) == 0
        outs.append(out)
    return outs[0], outs[1]


def _raw(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "raw.jsonl").read_text().splitlines()]


def test_outputs_are_written(two_studies):
    out, _ = two_studies
    for name in ("summary.json", "summary.md", "curves.png", "raw.jsonl"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["results"]) == {"8/0", "4/4"}
    assert summary["study"]["scripted_solvers"] == 1 and "definitions" in summary
    assert "| 4/4 |" in (out / "summary.md").read_text()
    assert "## Cost" in (out / "summary.md").read_text()  # the runs' CPU hours
    assert len(_raw(out)) == 2 * 2 * 4  # configs x nodes x rounds; solvers are not learners
    assert (out / "runs" / "4-4" / "seed-0" / "node-1" / "metrics.jsonl").is_file()


def test_same_seed_gives_identical_metrics(two_studies):
    a, b = (json.loads((out / "summary.json").read_text()) for out in two_studies)
    assert a["results"] == b["results"]
    assert a["runs"] == b["runs"]
    strip = lambda rows: [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rows]  # noqa: E731
    assert strip(_raw(two_studies[0])) == strip(_raw(two_studies[1]))


def test_mix_uses_exactly_i_local_and_j_external(two_studies):
    rows = _raw(two_studies[0])
    isolated = [r for r in rows if r["config"] == "8/0"]
    shared = [r for r in rows if r["config"] == "4/4"]
    assert all(r["local_groups"] == 8 and r["external_groups"] == 0 for r in isolated)
    # 4 groups from the other learner + 4 from the scripted solver are eligible under `uniform`
    assert all(r["local_groups"] == 4 and r["external_groups"] == 4 for r in shared)
    # ... and they came through the codec and the intake checks, none refused
    assert all(r["accepted"] == 8 * r["round"] and not r["rejected"] for r in shared)


def test_configs_parse_and_reject():
    configs = parse_configs(["8/0", "4/4", "adaptive"])
    assert [(c.local, c.external, c.adaptive) for c in configs] == [(8, 0, False), (4, 4, False), (4, 4, True)]
    for bad in ("8-0", "0/0", "a/b"):
        with pytest.raises(ValueError, match="I/J"):
            parse_configs([bad])
    assert ExperimentSettings(configs="8/0, 4/4").configs == ["8/0", "4/4"]


def test_every_treatment_reaches_a_libp2p_node_process_as_flags_start_accepts():
    from sapo.node.flags import node_settings_from_flags

    for name, overrides in TREATMENTS.items():
        config = parse_configs([f"4/4+{name}"])[0]
        settings = node_settings_from_flags(config.node_flags())
        flat = {field: value for concern in settings.model_dump().values() for field, value in concern.items()}
        assert {key: flat[key] for key in overrides} == overrides, name
    # the importance treatment needs a boolean flag, which `start` takes as --x / --no-x
    assert "--share-logprobs" in parse_configs(["4/4+importance"])[0].node_flags()


def test_heterogeneity_assignments():
    base = load_settings({"model": "tiny"})
    assert [node_model(base, ExperimentSettings(mixed_sizes=True), k) for k in range(4)] == [
        "tiny-micro",
        "tiny-small",
        "tiny",
        "tiny-micro",
    ]
    assert [node_model(base, ExperimentSettings(mixed_tokenizers=True), k) for k in range(3)] == [
        "tiny",
        "tiny-bpe",
        "tiny",
    ]
    tasks = default_task_specs(["basic_arithmetic", "base_conversion", "bf"])
    assert [t.name for t in specialist_tasks(tasks, 8, 4)] == ["base_conversion"]
    with pytest.raises(ValueError, match="two --tasks"):
        specialist_tasks(tasks[:1], 8, 0)


def test_metrics_by_hand():
    assert moving_average([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]
    m = curve_metrics([[0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0]], window=100)  # node mean: 0, 1, 0, 0.5
    assert m["cumulative"] == 1.5 and m["peak_ma"] == 0.375 and m["peak_round"] == 4  # the window shrinks to 4
    m = curve_metrics([[0.0] * 99 + [1.0, 0.0, 0.0]], window=100)  # MA 0.01, 0.01, 0.01
    assert m["peak_round"] == 100 and m["oscillation"] == 0.0
    interval = paired_interval([1.0, 1.2, 1.4, 1.2])  # sd 0.1633, t(3) = 3.182: half-width 0.2598
    assert interval["seeds"] == 4 and interval["mean"] == pytest.approx(1.2)
    assert (interval["low"], interval["high"]) == pytest.approx((1.2 - 0.2598, 1.2 + 0.2598), abs=1e-3)
    assert paired_interval([]) is None


def test_sharing_arms_are_also_compared_with_the_strongest_arm_without_sharing():
    configs = parse_configs(["4/0", "2/2", "adaptive", "4/0+ownpositive"])
    cumulative = {"4/0": (10, 12), "2/2": (12, 18), "adaptive": (15, 15), "4/0+ownpositive": (12, 15)}
    runs = {
        name: [{"cumulative_accuracy": a, "cumulative_reward": a} for a in per_seed]
        for name, per_seed in cumulative.items()
    }
    by_name = {c.name: c for c in configs}
    # the own-row recipe beats plain 4/0 alone, so it is the reference (adaptive's I+J is 4 too)
    assert best_isolated(by_name["2/2"], configs, runs) == "4/0+ownpositive"
    assert best_isolated(by_name["adaptive"], configs, runs) == "4/0+ownpositive"
    alone = parse_configs(["4/0", "2/2"])  # one arm without sharing: nothing more to compare with
    assert best_isolated(alone[1], alone, runs) is None
    ratio = paired_ratios(runs["2/2"], runs["4/0+ownpositive"], "4/0+ownpositive")
    assert ratio["cumulative_accuracy"]["ratios"] == pytest.approx([1.0, 1.2])  # seed by seed
    results = {"2/2": {"ratio_to_best_isolated": ratio}} | {c: {} for c in cumulative if c != "2/2"}
    table = "\n".join(best_isolated_lines(results, configs))
    assert "| 2/2 | 4/0+ownpositive | 1.100 [" in table
    assert best_isolated_lines({c: {} for c in cumulative}, configs) == []


def test_held_out_accuracy_is_paired_as_a_difference_and_each_arm_costs_its_runs_cpu_hours():
    shared = [{"heldout": [(20, 0.4), (60, 0.6)]}, {"heldout": [(20, 0.5), (60, 0.7)]}]
    alone = [{"heldout": [(20, 0.4), (60, 0.5)]}, {"heldout": [(20, 0.4), (60, 0.5)]}]
    difference = paired_heldout(shared, alone)["heldout_last_difference"]
    assert difference["ratios"] == pytest.approx([0.1, 0.2])  # seed by seed; t(1) = 12.706, sd 0.0707
    assert (difference["low"], difference["high"]) == pytest.approx((0.15 - 0.635, 0.15 + 0.635), abs=1e-3)
    assert paired_heldout(shared, [{"heldout": []}, {"heldout": []}]) == {}  # no evals, nothing to pair
    configs = parse_configs(["4/0", "2/2"])
    results = {
        "4/0": {"heldout_first": {"mean": 0.4, "std": 0.0}, "heldout_last": {"mean": 0.5, "std": 0.0}},
        "2/2": {
            "heldout_first": {"mean": 0.45, "std": 0.07},
            "heldout_last": {"mean": 0.65, "std": 0.07},
            "ratio_to_baseline": {"heldout_last_difference": difference},
        },
    }
    table = "\n".join(heldout_lines(results, configs))
    assert "| 2/2 | 0.45 ± 0.07 → 0.65 ± 0.07 | +0.150 [-0.485, +0.785] | – | – |" in table
    # 9 CPU s a node-round, 4 nodes, 60 rounds, 2 seeds: 1.2 hours; a run without CPU timing: unknown
    timing = {f"4/0 seed {s}": {"cpu_per_node_round": 9.0} for s in (0, 1)}
    assert cpu_hours(timing, "4/0", seeds=2, nodes=4, rounds=60) == pytest.approx(1.2)
    assert cpu_hours(timing | {"4/0 seed 1": {"cpu_per_node_round": None}}, "4/0", 2, 4, 60) is None


def test_a_mixed_study_pairs_each_model_with_its_own_nodes_in_the_reference_arm():
    def node(model: str, accuracy: float) -> list[dict]:
        keys = {"reward": accuracy, "format_rate": 1.0, "heldout": None}
        return [{"model": model, "round": r, "accuracy": accuracy, **keys} for r in (1, 2)]

    configs = parse_configs(["8/0", "4/0", "4/4"])
    # per seed and config: one "a" node and two "b" nodes; sharing helps a (x2), hurts b (x0.5)
    accuracy = {"8/0": (0.2, 0.4), "4/0": (0.1, 0.4), "4/4": (0.4, 0.2)}
    founders = {
        (c, s): [node("a", a * (1 + s)), node("b", b), node("b", b)] for c, (a, b) in accuracy.items() for s in (0, 1)
    }
    per_model = per_model_results(configs, founders, seeds=2, rounds=2, window=2)
    assert set(per_model) == {"a", "b"} and (per_model["a"]["nodes"], per_model["b"]["nodes"]) == (1, 2)
    a, b = per_model["a"]["results"]["4/4"], per_model["b"]["results"]["4/4"]
    assert a["ratio_to_baseline"]["cumulative_accuracy"]["ratios"] == pytest.approx([2.0, 2.0])
    assert a["ratio_to_local_only"]["cumulative_accuracy"]["ratios"] == pytest.approx([4.0, 4.0])
    assert b["ratio_to_baseline"]["cumulative_accuracy"]["ratios"] == pytest.approx([0.5, 0.5])
    assert a["cumulative_accuracy"]["mean"] == pytest.approx((0.8 + 1.6) / 2)  # seed 1's a doubles
    table = "\n".join(per_model_lines(per_model, configs))
    assert (
        "## Per model" in table
        and "| b | 2 | 4/4 | 0.40 ± 0.00 | 0.500 [0.500, 0.500] | 0.500 [0.500, 0.500] |" in table
    )
    # one model everywhere: nothing per model
    same = {key: [node("a", 0.5)] for key in founders}
    assert per_model_results(configs, same, seeds=2, rounds=2, window=2) == {}


def test_spread_counts_the_first_round_each_node_holds_the_threshold():
    fast = [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    slow = [0.0] * 4 + [1.0] * 4
    never = [0.5] * 8
    spread = spread_metrics([fast, slow], threshold=0.9)
    # trailing 5-round mean: fast's first full window of ones ends at round 6; slow's best window is 0.8
    assert spread["first_round_per_node"] == [6, None]
    assert spread["first_node_round"] == 6 and spread["all_nodes_round"] is None
    assert spread_metrics([fast, fast])["all_nodes_round"] == 6
    assert spread_metrics([never], threshold=0.5)["first_round_per_node"] == [5]


def test_max_minutes_compares_configs_over_the_rounds_all_completed(tmp_path):
    out = tmp_path / "timed"
    # a deadline already past: no run completes a round, which is an error, not an empty summary
    with pytest.raises(RuntimeError, match="before any run completed a round"):
        main([*STUDY, "--out", str(out), "--jobs", "1", "--max-minutes", "1e-9"])


def test_study_defaults_apply_the_tiny_stand_in_only_to_tiny_models():
    from sapo.node.study.cli import experiment_node_settings

    tiny = experiment_node_settings([])
    assert tiny.model.model == "tiny-micro" and tiny.training.lr == 3e-4
    assert tiny.tasks.tasks == ["basic_arithmetic"] and tiny.training.max_new_tokens == 24
    assert tiny.tasks.specs()[0].config["operators"] == ["+"] and tiny.model.warm_start_answer_noise == 0.6
    assert tiny.run.eval_every == 25
    real = experiment_node_settings(["--model", "smollm2-135m", "--lora"])
    assert real.training.lr is None and real.model.warm_start_steps is None  # the model's own defaults
    assert len(real.tasks.tasks) == 9 and real.training.max_new_tokens == 256
    assert experiment_node_settings(["--lr", "1e-3"]).training.lr == 1e-3  # the user's flag wins


def test_the_same_study_runs_over_real_libp2p_node_processes(tmp_path):
    """--transport libp2p: each run is a `sapo-node swarm` on 127.0.0.1; the summary has the same shape."""
    out = tmp_path / "libp2p"
    assert (
        main(
            [
                "experiment",
                "--transport",
                "libp2p",
                "--nodes",
                "2",
                "--configs",
                "2/0,1/1",
                "--rounds",
                "2",
                "--seeds",
                "1",
                "--no-progress",
                "--out",
                str(out),
                "--generations",
                "4",
                "--max-new-tokens",
                "8",
                "--warm-start-steps",
                "0",
                "--sampler",
                "uniform",
                "--augment-external",
                "1",
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["study"]["transport"] == "libp2p" and set(summary["results"]) == {"2/0", "1/1"}
    rows = _raw(out)
    assert len(rows) == 2 * 2 * 2 and all(r["transport"] == "libp2p" for r in rows)
    assert all(r["external_groups"] == 0 for r in rows if r["config"] == "2/0")
    # over the network, round visibility is not lockstep: a node gets the other's groups once they arrive
    assert sum(r["external_groups"] for r in rows if r["config"] == "1/1") >= 1
    assert all(r["local_groups"] == 1 for r in rows if r["config"] == "1/1")


def test_libp2p_transport_refuses_what_only_the_in_memory_study_can_do():
    with pytest.raises(ValueError, match="homogeneous fixed-I/J"):
        ExperimentSettings(transport="libp2p", configs="8/0,adaptive")
    with pytest.raises(ValueError, match="scripted_solvers"):
        ExperimentSettings(transport="libp2p", scripted_solvers=2)


def test_resummarize_recomputes_the_same_results_from_raw(two_studies, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(two_studies[0], copy)
    before = json.loads((copy / "summary.json").read_text())
    (copy / "summary.md").unlink()
    assert main(["experiment", "--resummarize", str(copy)]) == 0
    after = json.loads((copy / "summary.json").read_text())
    assert after["results"] == before["results"] and after["runs"] == before["runs"]
    assert (copy / "summary.md").read_text().startswith("# SAPO I/J study")


def test_resummarize_says_which_rows_its_recorded_settings_leave_out(two_studies, tmp_path, caplog):
    """Raw rows of a later seed beside a summary.json that records fewer seeds are named, not
    silently dropped (a study extended by seeds, whose new summary.json was not copied in)."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(two_studies[0], copy)
    summary = json.loads((copy / "summary.json").read_text())
    # a later seed under way: one round in, which must not shorten the rounds compared either
    later_seed = [
        r | {"seed": summary["study"]["seeds"]} for r in _raw(copy) if r["config"] == "4/4" and r["round"] == 1
    ]
    with (copy / "raw.jsonl").open("a") as raw:
        raw.writelines(json.dumps(r) + "\n" for r in later_seed)
    with caplog.at_level("WARNING", logger="sapo.experiment"):
        assert main(["experiment", "--resummarize", str(copy)]) == 0
    assert f"left out the rows of 4/4 seed {summary['study']['seeds']}" in caplog.text
    after = json.loads((copy / "summary.json").read_text())
    assert after["results"] == summary["results"] and after["rounds_compared"] == summary["rounds_compared"] > 1


def test_workers_end_with_a_killed_study(tmp_path):
    """kill -9 of `sapo-node experiment --jobs 2` leaves no worker training on (Linux)."""
    import signal
    import subprocess
    import sys
    import time

    psutil = pytest.importorskip("psutil")
    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    study = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sapo.node.cli",
            *STUDY[: STUDY.index("--rounds")],
            "--rounds",
            "10000",
            *STUDY[STUDY.index("--rounds") + 2 :],
            "--out",
            str(tmp_path / "s"),
            "--jobs",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        raws = [tmp_path / "s" / "runs" / name / "seed-0" / "raw.jsonl" for name in ("8-0", "4-4")]
        while time.monotonic() < deadline and not all(raw.exists() and raw.stat().st_size for raw in raws):
            time.sleep(0.5)  # both runs are training
        workers = [
            p for p in psutil.Process(study.pid).children(recursive=True) if "spawn_main" in " ".join(p.cmdline())
        ]
        assert len(workers) >= 2, "the study never started its workers"
        study.send_signal(signal.SIGKILL)
        study.wait(10)
        gone, alive = psutil.wait_procs(workers, timeout=20)
        assert not alive, [p.cmdline()[:3] for p in alive]
    finally:
        for p in [
            *psutil.Process().children(recursive=True),
            *(w for w in locals().get("workers", []) if w.is_running()),
        ]:
            p.kill()
