"""The study's outputs, summary.json, summary.md and curves.png, from its runs' curves; and
`--resummarize`, which rebuilds all three from raw.jsonl."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

from sapo.node.core.loading import warm_start_settings
from sapo.node.core.settings import NodeSettings
from sapo.node.study.metrics import (
    SPREAD_ACCURACY,
    SPREAD_FORMAT,
    SPREAD_WINDOW,
    late_joiner_metrics,
    per_model_results,
    run_metrics,
    summarize,
)
from sapo.node.study.nodes import node_model, specialist_tasks
from sapo.node.study.plots import plot_curves
from sapo.node.study.run_timing import cpu_hours
from sapo.node.study.settings import MA_WINDOW, METRIC_DEFINITIONS, ExperimentSettings, MixConfig, parse_configs

log = logging.getLogger("sapo.experiment")


def write_outputs(
    study: ExperimentSettings, configs: list[MixConfig], rows: list[dict], meta: dict[str, Any]
) -> dict[str, Any]:
    """Every run's metrics from its rows, then summary.json, summary.md and curves.png.

    Under --max-minutes runs may stop at different rounds; every config is compared over the
    rounds all of them completed (raw.jsonl keeps every round).
    """
    per_run: dict[tuple[str, int], dict[int, list[dict]]] = {}
    for row in rows:
        per_run.setdefault((row["config"], row["seed"]), {}).setdefault(row["node"], []).append(row)
    named = [(c.name, s) for c in configs for s in range(study.seeds)]
    # A study extended by seeds keeps the rows of runs its settings do not name (a later seed under
    # way, or raw rows copied in beside an older summary.json): say which are left out.
    unnamed = sorted(set(per_run) - set(named))
    if unnamed:
        left_out = ", ".join(f"{config} seed {seed}" for config, seed in unnamed)
        log.warning(
            "%s: %d seed(s) of %s summarized; left out the rows of %s", study.out, study.seeds, study.configs, left_out
        )
    missing = [key for key in named if key not in per_run]
    if missing:
        raise RuntimeError(f"no rows for {missing}: --max-minutes ended the study before any run completed a round")
    # only the named runs: a later seed's few rounds must not shorten the rounds compared
    node_rows = {
        key: [sorted(per_run[key][k], key=lambda r: r["round"]) for k in sorted(per_run[key])] for key in named
    }
    # The run's founders (who start at round 1) give the swarm's metrics; late joiners their own.
    founders = {key: [r for r in runs_ if r[0].get("joined", 1) == 1] for key, runs_ in node_rows.items()}
    joiners = {key: [r for r in runs_ if r[0].get("joined", 1) > 1] for key, runs_ in node_rows.items()}
    rounds = min(len(rows_) for runs_ in founders.values() for rows_ in runs_)
    window = ma_window(study, rounds)

    def one_run(config: MixConfig, seed: int) -> dict[str, Any]:
        key = (config.name, seed)
        metrics = run_metrics(founders[key], rounds, window) | {"seed": seed}
        late = late_joiner_metrics(joiners[key], founders[key], rounds) if joiners[key] else None
        return metrics | ({"late_joiners": late} if late else {})

    runs = {c.name: [one_run(c, s) for s in range(study.seeds)] for c in configs}
    summary = {
        "definitions": METRIC_DEFINITIONS,
        "round_visibility": meta["round_visibility"],
        "study": study.model_dump(mode="json"),
        "node_settings": meta["node_settings"],
        "nodes": meta["nodes"],
        "warm_start": meta["warm_start"],
        "reasoning_gym": meta["reasoning_gym"],
        "results": summarize(configs, runs),
        "per_model": per_model_results(configs, founders, study.seeds, rounds, window),
        "runs": runs,
        "rounds_compared": rounds,
        "ma_window": window,
        "timing": meta["timing"],
    }
    out = study.out
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(render_markdown(summary, configs))
    plot_curves(runs, configs, window, out / "curves.png")
    return summary


def ma_window(study: ExperimentSettings, rounds: int) -> int:
    """The paper's 100-round window, shortened for short studies so the curve has a shape."""
    if study.ma_window:
        return min(study.ma_window, rounds)
    return min(MA_WINDOW, max(1, rounds // 3))


def read_rows(out: Path) -> list[dict]:
    raw = out / "raw.jsonl"
    # committed results keep their raw rows gzipped
    text = raw.read_text() if raw.exists() else gzip.decompress((out / "raw.jsonl.gz").read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines()]


def resummarize(out: Path, ma_window_override: int | None = None) -> dict[str, Any]:
    """Recompute summary.json, summary.md and curves.png of a finished (or stopped) study from its
    raw.jsonl, with this version's metrics; the study's recorded settings are kept."""
    if not (out / "summary.json").exists():
        raise FileNotFoundError(f"{out}/summary.json is missing; resummarize needs the study's recorded settings")
    old = json.loads((out / "summary.json").read_text())
    study_fields = {k: v for k, v in old["study"].items() if k in ExperimentSettings.model_fields}
    study = ExperimentSettings(
        **(study_fields | {"out": out} | ({"ma_window": ma_window_override} if ma_window_override else {}))
    )
    meta = {k: old[k] for k in ("round_visibility", "node_settings", "nodes", "warm_start", "reasoning_gym", "timing")}
    return write_outputs(study, parse_configs(study.configs), read_rows(out), meta)


def node_table(base: NodeSettings, study: ExperimentSettings) -> list[dict[str, Any]]:
    table = []
    for k in range(study.nodes):
        row = {"node": k, "role": "learner", "model": node_model(base, study, k)}
        if study.specialists == "tasks":
            row["warm_start_tasks"] = [t.name for t in specialist_tasks(base.tasks.specs(), study.nodes, k)]
        table.append(row)
    table += [
        {"node": f"solver-{k}", "role": "scripted", "accuracy": study.solver_accuracy}
        for k in range(study.scripted_solvers)
    ]
    return table


def warm_start_recipe(base: NodeSettings, study: ExperimentSettings) -> dict[str, Any] | None:
    settings = base
    if study.format_discovery is not None:
        settings = base.model_copy(
            update={"model": base.model.model_copy(update={"warm_start_tag_rate": study.format_discovery})}
        )
    recipe = warm_start_settings(settings)
    if recipe is None:
        return None
    return {
        "settings": recipe.model_dump(mode="json"),
        "tasks": "per node (specialists)"
        if study.specialists == "tasks"
        else [t.model_dump(mode="json") for t in base.tasks.specs()],
        "questions": f"node k: share k of {study.nodes}" if study.specialists == "questions" else "all",
        "shared": "one per model source and task list, the same for every seed (like one pretrained checkpoint)",
    }


def _fmt(stat: dict[str, float] | None, digits: int = 3) -> str:
    if not stat:
        return "–"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def _ratio(entry: dict[str, Any], label: str, metric: str) -> str:
    ratio = entry.get(f"ratio_to_{label}")
    if not ratio or metric not in ratio:
        return "–"
    return _interval(ratio[metric])


def _interval(r: dict[str, Any] | None, spec: str = ".3f") -> str:
    """A paired mean with its interval; spec "+.3f" signs a difference."""
    if not r:
        return "–"
    if r["low"] is None:
        return f"{r['mean']:{spec}}"
    return f"{r['mean']:{spec}} [{r['low']:{spec}}, {r['high']:{spec}}]"


def _heldout_cell(r: dict[str, Any], key: str = "heldout") -> str:
    return f"{_fmt(r.get(f'{key}_first'), 2)} → {_fmt(r.get(f'{key}_last'), 2)}"


def _accuracy_cells(r: dict[str, Any]) -> str:
    """An arm's accuracy cells, the same in the swarm's table and in each model's: cumulative
    accuracy, its ratios to T/0 and I/0, sampled accuracy first -> last tenth, held-out."""
    heldout = _heldout_cell(r) if "heldout_first" in r else "–"
    return (
        f"{_fmt(r['cumulative_accuracy'], 2)} | {_ratio(r, 'baseline', 'cumulative_accuracy')} | "
        f"{_ratio(r, 'local_only', 'cumulative_accuracy')} | {_fmt(r['accuracy_start'], 2)} → {_fmt(r['accuracy_end'], 2)} | "
        f"{heldout}"
    )


def _difference(entry: dict[str, Any], label: str, key: str = "heldout") -> str:
    return _interval((entry.get(f"ratio_to_{label}") or {}).get(f"{key}_last_difference"), "+.3f")


HELDOUT_KINDS = {
    "heldout": "Greedy pass@1",
    "heldout_sampled": "Sampled pass@1 (the full-credit fraction of --eval-samples answers per question)",
}


def heldout_lines(results: dict[str, Any], configs: list[MixConfig]) -> list[str]:
    """Held-out accuracy at the last evaluation, against the reference arms as paired differences:
    greedy, and sampled where the study sampled."""
    lines: list[str] = []
    for key, kind in HELDOUT_KINDS.items():
        if not any(f"{key}_first" in results[c.name] for c in configs):
            continue
        lines += [
            "",
            "## Held-out accuracy, paired" + ("" if key == "heldout" else ": sampled"),
            "",
            f"{kind}, full credit, on the held-out set at the first and last evaluation; the last one minus the "
            "reference arm's, paired per seed (95 % interval).",
            "",
            "| config | held-out, first → last | − T/0 | − I/0 | − best isolated |",
            "|---|---|---|---|---|",
        ]
        for config in configs:
            r = results[config.name]
            lines.append(
                f"| {config.name} | {_heldout_cell(r, key)} | {_difference(r, 'baseline', key)} | "
                f"{_difference(r, 'local_only', key)} | {_difference(r, 'best_isolated', key)} |"
            )
    return lines


def cost_lines(summary: dict[str, Any], configs: list[MixConfig]) -> list[str]:
    """Each arm's CPU hours, from the runs' timings (which the summary keeps)."""
    study, runs = summary["study"], summary["timing"].get("runs", {})
    hours = {
        c.name: cpu_hours(runs, c.name, study["seeds"], study["nodes"], summary["rounds_compared"]) for c in configs
    }
    if all(h is None for h in hours.values()):
        return []
    lines = [
        "",
        "## Cost",
        "",
        "CPU hours of each arm's rounds over all its seeds (set-ups left out; a run's untimed rounds, from before "
        "runs were timed across resumptions, counted at its timed rate).",
        "",
        "| config | CPU hours |",
        "|---|---|",
    ]
    lines += [f"| {name} | {'–' if h is None else f'{h:.2f}'} |" for name, h in hours.items()]
    return lines + [f"| all | {sum(h for h in hours.values() if h is not None):.2f} |"]


def best_isolated_lines(results: dict[str, Any], configs: list[MixConfig]) -> list[str]:
    """Each arm over the strongest arm without sharing at its I+J, where the study has several."""
    compared = [c for c in configs if "ratio_to_best_isolated" in results[c.name]]
    if not compared:
        return []
    lines = [
        "",
        "## Against the best isolated recipe",
        "",
        "The strongest arm without sharing at the same I+J (highest mean cumulative accuracy), paired per seed.",
        "",
        "| config | best isolated | cumulative accuracy ÷ | cumulative reward ÷ |",
        "|---|---|---|---|",
    ]
    for config in compared:
        r = results[config.name]
        lines.append(
            f"| {config.name} | {r['ratio_to_best_isolated']['reference']} | "
            f"{_ratio(r, 'best_isolated', 'cumulative_accuracy')} | {_ratio(r, 'best_isolated', 'cumulative_reward')} |"
        )
    return lines


def render_markdown(summary: dict[str, Any], configs: list[MixConfig]) -> str:
    study, results = summary["study"], summary["results"]
    settings = summary["node_settings"]
    lines = [
        "# SAPO I/J study",
        "",
        f"{study['nodes']} learning nodes, {summary['rounds_compared']} rounds"
        + (
            f" (of {study['rounds']} asked; --max-minutes {study['max_minutes']} ended the runs)"
            if summary["rounds_compared"] < study["rounds"]
            else ""
        )
        + f", {study['seeds']} seed(s), model {settings['model']}, tasks {', '.join(settings['tasks'])}, "
        f"{settings['updates_per_batch']} x {settings['minibatches']} clipped steps a round, lr {settings['lr']}. "
        f"Round visibility: {summary['round_visibility']}.",
        "",
        "## Accuracy",
        "",
        "Accuracy is the full-credit rate of a node's own completions (partial credit is not accuracy); cumulative "
        "accuracy sums it over the rounds, averaged over the nodes. Ratios are paired per seed, with their 95 % "
        "interval (t over the seeds): to T/0 (the same I+J without sharing, the paper's baseline) and to I/0 (the same "
        "generation). Compute: tokens generated (own questions, plus own completions for external ones) and "
        "completion tokens trained on, per node-round.",
        "",
        "| config | cumulative accuracy | ÷ T/0 | ÷ I/0 | accuracy, first → last tenth | held-out, first → last | "
        "generated tok | update tok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for config in configs:
        r = results[config.name]
        lines.append(
            f"| {config.name} | {_accuracy_cells(r)} | {r['generated_tokens']['mean']:.0f} | {r['update_tokens']['mean']:.0f} |"
        )
    lines += [
        "",
        "## Reward (the paper's metric, partial credit included)",
        "",
        "| config | cumulative reward | ÷ T/0 | ÷ I/0 | peak MA | oscillation | final MA |",
        "|---|---|---|---|---|---|---|",
    ]
    for config in configs:
        r = results[config.name]
        lines.append(
            f"| {config.name} | {_fmt(r['cumulative_reward'], 2)} | {_ratio(r, 'baseline', 'cumulative_reward')} | "
            f"{_ratio(r, 'local_only', 'cumulative_reward')} | {_fmt(r['reward_peak_ma'])} | "
            f"{_fmt(r['reward_oscillation'], 5)} | {_fmt(r['reward_final_ma'])} |"
        )
    lines += best_isolated_lines(results, configs)
    lines += heldout_lines(results, configs)
    lines += cost_lines(summary, configs)
    lines += [
        "",
        "## How fast the format and the accuracy spread",
        "",
        f"Format rate: fraction of a node's local completions with an `<answer>` tag. Spread: the first round at "
        f"which a node's trailing {SPREAD_WINDOW}-round mean reaches the threshold (first node / every node; "
        "'–' = not reached), one value per seed.",
        "",
        f"| config | format, last tenth | format ≥ {SPREAD_FORMAT}: first node | every node | "
        f"accuracy ≥ {SPREAD_ACCURACY}: first node | every node | external groups a round |",
        "|---|---|---|---|---|---|---|",
    ]
    seeds_of = lambda values: ", ".join("–" if v is None else str(v) for v in values)  # noqa: E731
    for config in configs:
        r = results[config.name]
        spread = r["spread"]
        lines.append(
            f"| {config.name} | {_fmt(r['format_end'], 2)} | {seeds_of(spread['format']['first_node_round'])} | "
            f"{seeds_of(spread['format']['all_nodes_round'])} | {seeds_of(spread['accuracy']['first_node_round'])} | "
            f"{seeds_of(spread['accuracy']['all_nodes_round'])} | {r['external_groups']['mean']:.2f} |"
        )
    lines += per_model_lines(summary.get("per_model", {}), configs)
    lines += late_joiner_lines(results, configs)
    lines += ["", "## Definitions", ""]
    lines += [f"- **{k}**: {v}" for k, v in summary["definitions"].items()]
    heterogeneity = (
        "specialists",
        "mixed_sizes",
        "mixed_tokenizers",
        "scripted_solvers",
        "solver_accuracy",
        "format_discovery",
        "late_joiners",
        "join_round",
    )
    flags = {k: study[k] for k in heterogeneity}
    lines += [
        "",
        "## Heterogeneity and warm start",
        "",
        f"- flags: `{json.dumps(flags)}`",
        f"- warm start: `{json.dumps(summary['warm_start'])}`",
        "",
    ]
    return "\n".join(lines)


def per_model_lines(per_model: dict[str, Any], configs: list[MixConfig]) -> list[str]:
    """Each model's own accuracy table, when the nodes ran more than one model."""
    if not per_model:
        return []
    lines = [
        "",
        "## Per model",
        "",
        "The accuracy table over each model's nodes only; its ratios pair the same model's nodes in the reference "
        "arm, seed by seed (95 % interval).",
        "",
        "| model | nodes | config | cumulative accuracy | ÷ T/0 | ÷ I/0 | accuracy, first → last tenth | held-out, first → last |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, entry in per_model.items():
        for config in configs:
            lines.append(
                f"| {model} | {entry['nodes']} | {config.name} | {_accuracy_cells(entry['results'][config.name])} |"
            )
    return lines


def late_joiner_lines(results: dict[str, Any], configs: list[MixConfig]) -> list[str]:
    """The late joiners' table, when the study had some."""
    late = {c.name: results[c.name]["late_joiners"] for c in configs if "late_joiners" in results[c.name]}
    if not late:
        return []
    first = next(iter(late.values()))
    lines = [
        "",
        "## Late joiners",
        "",
        f"{first['nodes']} node(s) of each run joined at round {first['join_round']}, from the same warm start as the "
        f"founders; their cumulative accuracy over their first {first['rounds']} rounds, against the founders' over "
        "their own first as many rounds (in the same run), and against the late joiners of the reference arms (paired "
        "per seed, 95 % interval).",
        "",
        "| config | joiners' cumulative accuracy | founders' first rounds | ÷ founders | ÷ T/0's joiners | ÷ I/0's joiners | "
        "joiners' accuracy, first → last tenth |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in late.items():
        lines.append(
            f"| {name} | {_fmt(entry['cumulative_accuracy'], 2)} | {_fmt(entry['founders_cumulative_accuracy'], 2)} | "
            f"{_interval(entry['versus_founders'])} | {_ratio(entry, 'baseline', 'cumulative_accuracy')} | "
            f"{_ratio(entry, 'local_only', 'cumulative_accuracy')} | "
            f"{_fmt(entry['accuracy_start'], 2)} → {_fmt(entry['accuracy_end'], 2)} |"
        )
    return lines
