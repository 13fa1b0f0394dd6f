"""The study's numbers from per-node reward and format curves: cumulative reward, the moving
average, its peak and oscillation, how fast things spread, and paired ratios between arms."""

from __future__ import annotations

import statistics
from typing import Any

from sapo.node.study.settings import MA_WINDOW, MixConfig

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


def curve_metrics(per_node_rewards: list[list[float]], window: int = MA_WINDOW) -> dict[str, Any]:
    rounds = len(per_node_rewards[0])
    mean_curve = [sum(col) / len(col) for col in zip(*per_node_rewards)]
    window = min(window, rounds)
    ma = moving_average(mean_curve, window)
    peak = max(range(len(ma)), key=ma.__getitem__)
    after = ma[peak:]
    steps = [abs(b - a) for a, b in zip(after, after[1:])]
    return {
        "cumulative_reward": sum(sum(r) for r in per_node_rewards) / len(per_node_rewards),
        "cumulative_per_node": [sum(r) for r in per_node_rewards],
        "peak_ma": ma[peak],
        "peak_round": peak + window,
        "oscillation": sum(steps) / len(steps) if steps else 0.0,
        "final_ma": ma[-1],
        "ma_window": window,
        "mean_curve": mean_curve,
        "ma_curve": ma,
    }


FORMAT_WINDOW = 10
SPREAD_WINDOW = 5
SPREAD_FORMAT = 0.9
SPREAD_REWARD = 0.5


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


def _mean_std(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def summarize(configs: list[MixConfig], runs: dict[str, list[dict]]) -> dict[str, Any]:
    """Mean ± std over seeds per config, and paired ratios to T/0 and to I/0 where those arms exist."""
    def local_only(local: int) -> str | None:
        return next((c.name for c in configs if not c.adaptive and c.external == 0 and c.local == local), None)

    out: dict[str, Any] = {}
    for config in configs:
        seeds = runs[config.name]
        entry: dict[str, Any] = {
            key: _mean_std([s["metrics"][key] for s in seeds])
            for key in ("cumulative_reward", "peak_ma", "oscillation", "final_ma")
        }
        for label, ref in (("ratio_to_baseline", local_only(config.total)), ("ratio_to_local_only", local_only(config.local))):
            if ref is None or ref == config.name or config.adaptive and label == "ratio_to_local_only":
                continue
            ratios = [s["metrics"]["cumulative_reward"] / r["metrics"]["cumulative_reward"]
                      for s, r in zip(seeds, runs[ref]) if r["metrics"]["cumulative_reward"] > 0]
            if ratios:
                entry[label] = _mean_std(ratios) | {"reference": ref}
        entry["spread"] = {
            kind: {
                "threshold": seeds[0][kind]["threshold"],
                "first_node_round": [s[kind]["first_node_round"] for s in seeds],
                "all_nodes_round": [s[kind]["all_nodes_round"] for s in seeds],
                "nodes_reached": [s[kind]["nodes_reached"] for s in seeds],
            }
            for kind in ("format", "accuracy")
        }
        tenth = max(1, len(seeds[0]["metrics"]["format_curve"]) // 10)
        entry["format_rate_start"] = _mean_std([statistics.fmean(s["metrics"]["format_curve"][:tenth]) for s in seeds])
        entry["format_rate_end"] = _mean_std([statistics.fmean(s["metrics"]["format_curve"][-tenth:]) for s in seeds])
        entry |= {"local": config.local, "external": config.external, "adaptive": config.adaptive}
        out[config.name] = entry
    return out
