"""The study's numbers, all from raw.jsonl's rows (one per node and round), so a live study and
`--resummarize` compute them the same way.

Per run (one config x seed): per-node curves of accuracy (full-credit rate of the node's local
completions), reward (the verifier's score, partial credit included: the paper's metric) and
format rate; their cumulative sums averaged over the learning nodes; the moving average of the
node-averaged curve, its peak, last point and oscillation; held-out greedy accuracy; how fast
format and accuracy spread; and the compute spent per node-round.
Per config: mean ± std over seeds, and paired ratios to the arms with the same I+J and the same I
and no external groups (T/0, the paper's baseline; I/0, matched generation), each with its 95 %
interval (Student's t over the per-seed ratios).
"""

from __future__ import annotations

import statistics
from typing import Any

from sapo.node.study.settings import MixConfig

FORMAT_WINDOW = 10
SPREAD_WINDOW = 5
SPREAD_FORMAT = 0.9
SPREAD_ACCURACY = 0.5
# Student's t at 97.5 % for 1..30 degrees of freedom (a 95 % two-sided interval); 1.96 beyond.
T_975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
RATIO_METRICS = ("cumulative_accuracy", "cumulative_reward")


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over `window` points, one per full window (point i ends at round i + window)."""
    if window < 1 or len(values) < window:
        return []
    out, running = [], sum(values[:window])
    out.append(running / window)
    for i in range(window, len(values)):
        running += values[i] - values[i - window]
        out.append(running / window)
    return out


def curve_metrics(per_node: list[list[float]], window: int) -> dict[str, Any]:
    """Cumulative value (summed over rounds, averaged over nodes), and the moving average of the
    node-averaged curve: its peak, last point, and mean absolute step after the peak."""
    rounds = len(per_node[0])
    mean_curve = [sum(col) / len(col) for col in zip(*per_node)]
    window = min(window, rounds)
    ma = moving_average(mean_curve, window)
    peak = max(range(len(ma)), key=ma.__getitem__)
    after = ma[peak:]
    steps = [abs(b - a) for a, b in zip(after, after[1:])]
    return {
        "cumulative": sum(sum(r) for r in per_node) / len(per_node),
        "cumulative_per_node": [sum(r) for r in per_node],
        "peak_ma": ma[peak],
        "peak_round": peak + window,
        "oscillation": sum(steps) / len(steps) if steps else 0.0,
        "final_ma": ma[-1],
        "mean_curve": mean_curve,
        "ma_curve": ma,
    }


def spread_metrics(per_node: list[list[float]], threshold: float = SPREAD_FORMAT) -> dict[str, Any]:
    """How fast something spreads through the swarm: per node, the first round at which its
    trailing SPREAD_WINDOW-round mean reaches `threshold` (None if never); the swarm has it when
    its last node does."""
    firsts = []
    for curve in per_node:
        window = min(SPREAD_WINDOW, len(curve))
        ma = moving_average(curve, window)
        firsts.append(next((i + window for i, v in enumerate(ma) if v >= threshold), None))
    reached = [f for f in firsts if f is not None]
    return {
        "threshold": threshold,
        "first_round_per_node": firsts,
        "nodes_reached": len(reached),
        "first_node_round": min(reached) if reached else None,
        "all_nodes_round": max(reached) if len(reached) == len(firsts) else None,
    }


def heldout_curve(per_node_rows: list[list[dict]], key: str = "heldout") -> list[tuple[int, float]]:
    """(round, held-out accuracy averaged over tasks and nodes) at every round with an evaluation:
    greedy pass@1 (`heldout`), or sampled pass@1 (`heldout_sampled`, with --eval-samples)."""
    by_round: dict[int, list[float]] = {}
    for rows in per_node_rows:
        for row in rows:
            if row.get(key):
                by_round.setdefault(row["round"], []).append(statistics.fmean(row[key].values()))
    return [(r, statistics.fmean(v)) for r, v in sorted(by_round.items())]


def run_metrics(per_node_rows: list[list[dict]], rounds: int, window: int) -> dict[str, Any]:
    """Everything the summary says about one run, from its rows (per node, in round order),
    over its first `rounds` rounds."""
    rows = [node_rows[:rounds] for node_rows in per_node_rows]
    curve = lambda key: [[row[key] for row in node_rows] for node_rows in rows]  # noqa: E731
    accuracy, reward, formats = curve("accuracy"), curve("reward"), curve("format_rate")
    everything = [row for node_rows in rows for row in node_rows]
    per_round = lambda key: statistics.fmean(row.get(key, 0) for row in everything)  # noqa: E731
    acc, rew = curve_metrics(accuracy, window), curve_metrics(reward, window)
    tenth = max(1, rounds // 10)
    format_curve = [statistics.fmean(col) for col in zip(*formats)]
    return {
        "cumulative_accuracy": acc["cumulative"],
        "cumulative_reward": rew["cumulative"],
        "accuracy": acc,
        "reward": rew,
        "accuracy_start": statistics.fmean(acc["mean_curve"][:tenth]),
        "accuracy_end": statistics.fmean(acc["mean_curve"][-tenth:]),
        "format_curve": format_curve,
        "format_end": statistics.fmean(format_curve[-tenth:]),
        "heldout": heldout_curve(rows),
        "heldout_sampled": heldout_curve(rows, "heldout_sampled"),
        "format_spread": spread_metrics(formats, SPREAD_FORMAT),
        "accuracy_spread": spread_metrics(accuracy, SPREAD_ACCURACY),
        "external_groups": per_round("external_groups"),
        "generated_tokens": per_round("generated_tokens") + per_round("augment_tokens"),
        "update_tokens": per_round("update_tokens"),
    }


def late_joiner_metrics(
    joiners: list[list[dict]], founders: list[list[dict]], last_round: int
) -> dict[str, Any] | None:
    """What the nodes that joined late learned over their first k rounds (up to `last_round`),
    against what the nodes that started the run learned over their own first k rounds: both
    begin at the same warm start, so the difference is what an older swarm gave the newcomers."""
    rows = [[row for row in node_rows if row["round"] <= last_round] for node_rows in joiners]
    k = min((len(r) for r in rows), default=0)
    if k == 0:
        return None
    rows = [r[:k] for r in rows]
    accuracy = [[row["accuracy"] for row in r] for r in rows]
    mean_curve = [statistics.fmean(col) for col in zip(*accuracy)]
    founders_first = [sum(row["accuracy"] for row in node_rows[:k]) for node_rows in founders]
    tenth = max(1, k // 10)
    cumulative = sum(sum(a) for a in accuracy) / len(accuracy)
    founders_cumulative = statistics.fmean(founders_first)
    return {
        "nodes": len(rows),
        "join_round": rows[0][0]["joined"],
        "rounds": k,
        "cumulative_accuracy": cumulative,
        "founders_cumulative_accuracy": founders_cumulative,
        "versus_founders": cumulative / founders_cumulative if founders_cumulative > 0 else None,
        "accuracy_start": statistics.fmean(mean_curve[:tenth]),
        "accuracy_end": statistics.fmean(mean_curve[-tenth:]),
        "mean_curve": mean_curve,
        "heldout": heldout_curve(rows),
    }


def mean_std(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def paired_interval(values: list[float]) -> dict[str, Any] | None:
    """Mean of paired per-seed values (ratios, or differences) with its 95 % interval (t over the
    seeds), the values under "ratios" whichever they are; None without any (a reference arm that
    never scored)."""
    if not values:
        return None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "low": None, "high": None, "seeds": len(values), "ratios": values}
    half = T_975[min(len(values) - 1, len(T_975)) - 1] * statistics.stdev(values) / len(values) ** 0.5
    return {"mean": mean, "low": mean - half, "high": mean + half, "seeds": len(values), "ratios": values}


def reference_arms(config: MixConfig, configs: list[MixConfig]) -> dict[str, str]:
    """The arms a config is compared with: T/0 (same I+J, no external groups: the paper's
    baseline, matched batch) and I/0 (same I: matched generation)."""

    def local_only(local: int) -> str | None:
        return next((c.name for c in configs if not c.adaptive and c.external == 0 and c.local == local), None)

    refs = {"baseline": local_only(config.total)}
    if not config.adaptive:
        refs["local_only"] = local_only(config.local)
    return {label: ref for label, ref in refs.items() if ref is not None and ref != config.name}


def best_isolated(config: MixConfig, configs: list[MixConfig], runs: dict[str, list[dict]]) -> str | None:
    """The strongest arm without sharing at the config's I+J (the highest mean cumulative
    accuracy), when the study has more than one (T/0 and, say, T/0+ownpositive): a sharing arm
    should beat the best a node can do alone, not only the paper's baseline. None otherwise."""
    isolated = [c for c in configs if not c.adaptive and c.external == 0 and c.total == config.total]
    if len(isolated) < 2:
        return None
    return max(isolated, key=lambda c: statistics.fmean(s["cumulative_accuracy"] for s in runs[c.name])).name


def paired_ratios(seeds: list[dict], reference: list[dict], name: str) -> dict[str, Any]:
    """Each RATIO_METRICS metric of an arm over the reference arm's, seed by seed, with its interval."""
    pairs = list(zip(seeds, reference))
    ratios = {
        metric: paired_interval([s[metric] / r[metric] for s, r in pairs if r[metric] > 0]) for metric in RATIO_METRICS
    }
    return {"reference": name} | {metric: r for metric, r in ratios.items() if r is not None}


def paired_heldout(seeds: list[dict], reference: list[dict]) -> dict[str, Any]:
    """The last held-out accuracy of an arm minus the reference arm's, seed by seed, with its
    interval: a difference, not a ratio, since held-out accuracy can be 0. Greedy, and sampled
    where the study sampled; empty without evals."""
    out = {}
    for key, label in (("heldout", "heldout_last_difference"), ("heldout_sampled", "heldout_sampled_last_difference")):
        differences = [s[key][-1][1] - r[key][-1][1] for s, r in zip(seeds, reference) if s.get(key) and r.get(key)]
        difference = paired_interval(differences)
        if difference is not None:
            out[label] = difference
    return out


def summarize(configs: list[MixConfig], runs: dict[str, list[dict]]) -> dict[str, Any]:
    """Per config: mean ± std over seeds of each run metric, and paired ratios to T/0 and I/0."""
    out: dict[str, Any] = {}
    for config in configs:
        seeds = runs[config.name]
        entry: dict[str, Any] = {
            key: mean_std([s[key] for s in seeds])
            for key in (
                "cumulative_accuracy",
                "cumulative_reward",
                "accuracy_start",
                "accuracy_end",
                "format_end",
                "external_groups",
                "generated_tokens",
                "update_tokens",
            )
        }
        for curve in ("accuracy", "reward"):
            entry[f"{curve}_peak_ma"] = mean_std([s[curve]["peak_ma"] for s in seeds])
            entry[f"{curve}_final_ma"] = mean_std([s[curve]["final_ma"] for s in seeds])
            entry[f"{curve}_oscillation"] = mean_std([s[curve]["oscillation"] for s in seeds])
        for key in ("heldout", "heldout_sampled"):
            curves = [s[key] for s in seeds if s.get(key)]
            if curves:
                entry[f"{key}_first"] = mean_std([h[0][1] for h in curves])
                entry[f"{key}_last"] = mean_std([h[-1][1] for h in curves])
        references = reference_arms(config, configs)
        best = best_isolated(config, configs, runs)
        if best is not None and best != config.name:
            references["best_isolated"] = best
        for label, ref in references.items():
            entry[f"ratio_to_{label}"] = paired_ratios(seeds, runs[ref], ref) | paired_heldout(seeds, runs[ref])
        if all(s.get("late_joiners") for s in seeds):
            entry["late_joiners"] = late_joiner_summary(config, configs, seeds, runs)
        entry["spread"] = {
            kind: {
                "threshold": seeds[0][f"{kind}_spread"]["threshold"],
                "first_node_round": [s[f"{kind}_spread"]["first_node_round"] for s in seeds],
                "all_nodes_round": [s[f"{kind}_spread"]["all_nodes_round"] for s in seeds],
            }
            for kind in ("format", "accuracy")
        }
        entry |= {
            "local": config.local,
            "external": config.external,
            "adaptive": config.adaptive,
            "treatments": list(config.treatments),
        }
        out[config.name] = entry
    return out


def per_model_results(
    configs: list[MixConfig], founders: dict[tuple[str, int], list[list[dict]]], seeds: int, rounds: int, window: int
) -> dict[str, Any]:
    """In a study whose nodes run different models (--mixed-sizes, --mixed-tokenizers), each
    model's own numbers: every config summarised over that model's nodes only, with its ratios
    paired per seed against the same model's nodes in the reference arms. A swarm-wide ratio can
    hide a model that sharing hurts behind one it helps. Empty when every node runs one model."""
    model_of = lambda node_rows: node_rows[0].get("model")  # noqa: E731
    models = sorted({model_of(r) for runs_ in founders.values() for r in runs_} - {None})
    if len(models) < 2:
        return {}
    out: dict[str, Any] = {}
    for model in models:
        runs = {
            c.name: [
                run_metrics([r for r in founders[(c.name, s)] if model_of(r) == model], rounds, window) | {"seed": s}
                for s in range(seeds)
            ]
            for c in configs
        }
        nodes = sum(model_of(r) == model for r in founders[(configs[0].name, 0)])
        out[model] = {"nodes": nodes, "results": summarize(configs, runs)}
    return out


def late_joiner_summary(
    config: MixConfig, configs: list[MixConfig], seeds: list[dict], runs: dict[str, list[dict]]
) -> dict[str, Any]:
    """The late joiners of a config over seeds: their learning, how it compares with the founders'
    first rounds, and with the late joiners of the reference arms (paired per seed)."""
    late = [s["late_joiners"] for s in seeds]
    entry: dict[str, Any] = {
        key: mean_std([x[key] for x in late])
        for key in ("cumulative_accuracy", "founders_cumulative_accuracy", "accuracy_start", "accuracy_end")
    }
    entry |= {"nodes": late[0]["nodes"], "join_round": late[0]["join_round"], "rounds": late[0]["rounds"]}
    entry["versus_founders"] = paired_interval([x["versus_founders"] for x in late if x["versus_founders"] is not None])
    heldout = [x["heldout"] for x in late if x["heldout"]]
    if heldout:
        entry["heldout_last"] = mean_std([h[-1][1] for h in heldout])
    for label, ref in reference_arms(config, configs).items():
        pairs = [(s["late_joiners"], r.get("late_joiners")) for s, r in zip(seeds, runs[ref])]
        ratio = paired_interval(
            [
                s["cumulative_accuracy"] / r["cumulative_accuracy"]
                for s, r in pairs
                if r and r["cumulative_accuracy"] > 0
            ]
        )
        if ratio is not None:
            entry[f"ratio_to_{label}"] = {"reference": ref, "cumulative_accuracy": ratio}
    return entry
