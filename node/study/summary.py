"""The study's outputs, summary.json, summary.md and curves.png, from its runs' curves; and
`--resummarize`, which rebuilds all three from raw.jsonl."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path
from typing import Any

from sapo.node.daemon.node import warm_start_settings
from sapo.node.daemon.settings import NodeSettings
from sapo.node.study.metrics import SPREAD_FORMAT, SPREAD_REWARD, SPREAD_WINDOW, curve_metrics, spread_metrics, summarize
from sapo.node.study.nodes import node_model, specialist_tasks
from sapo.node.study.plots import plot_curves
from sapo.node.study.settings import MA_WINDOW, METRIC_DEFINITIONS, ExperimentSettings, MixConfig, parse_configs


def write_outputs(study: ExperimentSettings, configs: list[MixConfig], results: dict[tuple[str, int], dict],
                  meta: dict[str, Any]) -> dict[str, Any]:
    """Metrics from each run's per-node curves, then summary.json, summary.md and curves.png.

    Under --max-minutes runs may stop at different rounds; every config is compared over the
    rounds all of them completed (raw.jsonl keeps every round).
    """
    rounds = min(len(r["rewards"][0]) for r in results.values())
    if rounds == 0:
        raise RuntimeError("--max-minutes ended the study before any run completed a round")
    window = ma_window(study, rounds)
    for result in results.values():
        rewards = [curve[:rounds] for curve in result.pop("rewards")]
        formats = [curve[:rounds] for curve in result.pop("format_rates")]
        result["metrics"] = curve_metrics(rewards, window)
        result["metrics"]["format_curve"] = [statistics.fmean(col) for col in zip(*formats)]
        result["format"] = spread_metrics(formats)
        result["accuracy"] = spread_metrics(rewards, threshold=SPREAD_REWARD)
    runs: dict[str, list[dict]] = {c.name: [results[(c.name, s)] for s in range(study.seeds)] for c in configs}
    timing = dict(meta["timing"]) | {"runs": {name: [s.get("seconds") for s in seeds] for name, seeds in runs.items()}}
    summary = {
        "definitions": METRIC_DEFINITIONS,
        "round_visibility": meta["round_visibility"],
        "study": study.model_dump(mode="json"),
        "node_settings": meta["node_settings"],
        "nodes": meta["nodes"],
        "warm_start": meta["warm_start"],
        "reasoning_gym": meta["reasoning_gym"],
        "results": summarize(configs, runs),
        "runs": {name: [{k: v for k, v in s.items() if k != "seconds"} for s in seeds] for name, seeds in runs.items()},
        "rounds_compared": rounds,
        "ma_window": window,
        "timing": timing,
    }
    out = study.out
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(render_markdown(summary, configs))
    plot_curves(runs, configs, out / "curves.png")
    return summary


def ma_window(study: ExperimentSettings, rounds: int) -> int:
    """The paper's 100-round window, shortened for short studies so the curve has a shape."""
    if study.ma_window:
        return min(study.ma_window, rounds)
    return min(MA_WINDOW, max(1, rounds // 3))


def resummarize(out: Path, ma_window_override: int | None = None) -> dict[str, Any]:
    """Recompute summary.json, summary.md and curves.png of a finished (or stopped) study from its
    raw.jsonl, with this version's metrics; the study's recorded settings are kept."""
    old = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None
    if old is None:
        raise FileNotFoundError(f"{out}/summary.json is missing; resummarize needs the study's recorded settings")
    study_fields = {k: v for k, v in old["study"].items() if k in ExperimentSettings.model_fields}
    study = ExperimentSettings(**(study_fields | {"out": out} | ({"ma_window": ma_window_override} if ma_window_override else {})))
    configs = parse_configs(study.configs)
    per_run: dict[tuple[str, int], dict[int, list[dict]]] = {}
    raw = out / "raw.jsonl"
    # committed results keep their raw rows gzipped
    text = raw.read_text() if raw.exists() else gzip.decompress((out / "raw.jsonl.gz").read_bytes()).decode()
    for line in text.splitlines():
        row = json.loads(line)
        per_run.setdefault((row["config"], row["seed"]), {}).setdefault(row["node"], []).append(row)
    old_runs = {(name, s["seed"]): s for name, seeds in old.get("runs", {}).items() for s in seeds}
    old_seconds = {(name, i): t for name, times in old.get("timing", {}).get("runs", {}).items() for i, t in enumerate(times)}
    results = {}
    for key, nodes in per_run.items():
        rows = [sorted(nodes[k], key=lambda r: r["round"]) for k in sorted(nodes)]
        everything = [r for node_rows in rows for r in node_rows]
        results[key] = {
            "seed": key[1],
            "rewards": [[r["reward"] for r in node_rows] for node_rows in rows],
            "format_rates": [[r["format_rate"] for r in node_rows] for node_rows in rows],
            "external_groups_mean": statistics.fmean(r["external_groups"] for r in everything),
            "balance_history": old_runs.get(key, {}).get("balance_history", {}),
            "seconds": old_seconds.get(key),
        }
    meta = {k: old[k] for k in ("round_visibility", "node_settings", "nodes", "warm_start", "reasoning_gym")}
    meta["timing"] = {k: v for k, v in old.get("timing", {}).items() if k != "runs"}
    return write_outputs(study, configs, results, meta)


def node_table(base: NodeSettings, study: ExperimentSettings) -> list[dict[str, Any]]:
    table = []
    for k in range(study.nodes):
        row = {"node": k, "role": "learner", "model": node_model(base, study, k)}
        if study.specialists:
            row["warm_start_tasks"] = [t.name for t in specialist_tasks(base.tasks.specs(), study.nodes, k)]
        table.append(row)
    table += [{"node": f"solver-{k}", "role": "scripted", "accuracy": study.solver_accuracy} for k in range(study.scripted_solvers)]
    return table


def warm_start_recipe(base: NodeSettings, study: ExperimentSettings) -> dict[str, Any] | None:
    settings = base
    if study.format_discovery is not None:
        settings = base.model_copy(update={"model": base.model.model_copy(update={"warm_start_tag_rate": study.format_discovery})})
    recipe = warm_start_settings(settings)
    if recipe is None:
        return None
    return {"settings": recipe.model_dump(mode="json"), "tasks": "per node (specialists)" if study.specialists
            else [t.model_dump(mode="json") for t in base.tasks.specs()],
            "shared": "one per model source and task list, the same for every seed (like one pretrained checkpoint)"}


def _fmt(stat: dict[str, float] | None, digits: int = 3) -> str:
    if not stat:
        return "–"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def render_markdown(summary: dict[str, Any], configs: list[MixConfig]) -> str:
    study = summary["study"]
    lines = [
        "# SAPO I/J study",
        "",
        f"{study['nodes']} learning nodes, {summary['rounds_compared']} rounds"
        + (f" (of {study['rounds']} asked; --max-minutes {study['max_minutes']} ended the runs)"
           if summary["rounds_compared"] < study["rounds"] else "")
        + f", {study['seeds']} seed(s), model "
        f"{summary['node_settings']['model']}, tasks {', '.join(summary['node_settings']['tasks'])}, "
        f"sampler {summary['node_settings']['sampler']}. Round visibility: {summary['round_visibility']}.",
        "",
        "| config | cumulative reward | ÷ T/0 (matched batch) | ÷ I/0 (matched generation) | peak MA | oscillation | final MA |",
        "|---|---|---|---|---|---|---|",
    ]
    for config in configs:
        r = summary["results"][config.name]
        lines.append(
            f"| {config.name} | {_fmt(r['cumulative_reward'], 2)} | {_fmt(r.get('ratio_to_baseline'))} | "
            f"{_fmt(r.get('ratio_to_local_only'))} | {_fmt(r['peak_ma'])} | {_fmt(r['oscillation'], 5)} | {_fmt(r['final_ma'])} |"
        )
    lines += ["", "Values are mean ± std over seeds; ratios are paired per seed.", ""]
    lines += [
        "## How fast the format and the accuracy spread",
        "",
        f"Format rate: fraction of a node's local completions with an `<answer>` tag. Spread: the first round at "
        f"which a node's trailing {SPREAD_WINDOW}-round mean reaches the threshold (first node / every node; "
        "'–' = not reached), one value per seed.",
        "",
        "| config | format rate, first → last tenth | format ≥ {f}: first node | every node | reward ≥ {a}: first node | every node |".format(
            f=SPREAD_FORMAT, a=SPREAD_REWARD),
        "|---|---|---|---|---|---|",
    ]
    seeds_of = lambda values: ", ".join("–" if v is None else str(v) for v in values)  # noqa: E731
    for config in configs:
        r = summary["results"][config.name]
        spread = r["spread"]
        lines.append(
            f"| {config.name} | {_fmt(r['format_rate_start'], 2)} → {_fmt(r['format_rate_end'], 2)} | "
            f"{seeds_of(spread['format']['first_node_round'])} | {seeds_of(spread['format']['all_nodes_round'])} | "
            f"{seeds_of(spread['accuracy']['first_node_round'])} | {seeds_of(spread['accuracy']['all_nodes_round'])} |"
        )
    lines += ["", "## Definitions", ""]
    lines += [f"- **{k}**: {v}" for k, v in summary["definitions"].items()]
    heterogeneity = ("specialists", "mixed_sizes", "mixed_tokenizers", "scripted_solvers", "solver_accuracy", "format_discovery")
    flags = {k: study[k] for k in heterogeneity}
    lines += ["", "## Heterogeneity and warm start", "", f"- flags: `{json.dumps(flags)}`",
              f"- warm start: `{json.dumps(summary['warm_start'])}`", ""]
    return "\n".join(lines)
