"""The study's outputs, summary.json, summary.md and curves.png, from its runs' curves; and
`--resummarize`, which rebuilds all three from raw.jsonl. summary.md's text: summary_markdown.py."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

from sapo.node.core.loading import warm_start_settings
from sapo.node.core.settings import NodeSettings
from sapo.node.study.metrics import (
    late_joiner_metrics,
    per_model_results,
    run_metrics,
    summarize,
)
from sapo.node.study.nodes import node_model, specialist_tasks
from sapo.node.study.plots import plot_curves
from sapo.node.study.settings import MA_WINDOW, METRIC_DEFINITIONS, ExperimentSettings, MixConfig, parse_configs
from sapo.node.study.summary_markdown import render_markdown

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
