"""summary.md: the study's summary.json as tables, a section per question it answers."""

from __future__ import annotations

import json
from typing import Any

from sapo.node.study.metrics import SPREAD_ACCURACY, SPREAD_FORMAT, SPREAD_WINDOW
from sapo.node.study.run_timing import cpu_hours
from sapo.node.study.settings import MixConfig


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
    """summary.md: the study's setting, then a table per question, then what its terms mean."""
    results = summary["results"]
    lines = header_lines(summary)
    lines += accuracy_lines(results, configs)
    lines += reward_lines(results, configs)
    lines += best_isolated_lines(results, configs)
    lines += heldout_lines(results, configs)
    lines += cost_lines(summary, configs)
    lines += spread_lines(results, configs)
    lines += per_model_lines(summary.get("per_model", {}), configs)
    lines += late_joiner_lines(results, configs)
    lines += definition_lines(summary)
    return "\n".join(lines)


def header_lines(summary: dict[str, Any]) -> list[str]:
    """The title and one paragraph: nodes, rounds compared, seeds, model, tasks, the update."""
    study, settings = summary["study"], summary["node_settings"]
    return [
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
    ]


def accuracy_lines(results: dict[str, Any], configs: list[MixConfig]) -> list[str]:
    """Each config's cumulative accuracy, its ratios paired per seed, and its compute."""
    lines = [
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
    return lines


def reward_lines(results: dict[str, Any], configs: list[MixConfig]) -> list[str]:
    """The paper's metric: cumulative reward, partial credit included, and its moving average."""
    lines = [
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
    return lines


def spread_lines(results: dict[str, Any], configs: list[MixConfig]) -> list[str]:
    """How fast the answer format and the accuracy spread through each config's nodes."""
    lines = [
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
    return lines


def definition_lines(summary: dict[str, Any]) -> list[str]:
    """What each metric means, then the heterogeneity flags and the warm start the nodes had."""
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
    flags = {k: summary["study"][k] for k in heterogeneity}
    return [
        "",
        "## Definitions",
        "",
        *(f"- **{k}**: {v}" for k, v in summary["definitions"].items()),
        "",
        "## Heterogeneity and warm start",
        "",
        f"- flags: `{json.dumps(flags)}`",
        f"- warm start: `{json.dumps(summary['warm_start'])}`",
        "",
    ]


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
