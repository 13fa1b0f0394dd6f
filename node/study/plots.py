"""The study's curves.png: accuracy (moving average), format rate, and held-out accuracy per arm,
mean ± std over seeds."""

from __future__ import annotations

import statistics
from pathlib import Path

from sapo.node.study.metrics import FORMAT_WINDOW, moving_average
from sapo.node.study.settings import MixConfig


def _band(axis, x, family, label):
    mean = [statistics.fmean(col) for col in zip(*family)]
    (line,) = axis.plot(x, mean, label=label, linewidth=1.6, marker="o" if len(mean) < 3 else None)
    if len(family) > 1:
        std = [statistics.stdev(col) for col in zip(*family)]
        axis.fill_between(
            x,
            [m - s for m, s in zip(mean, std)],
            [m + s for m, s in zip(mean, std)],
            color=line.get_color(),
            alpha=0.15,
            linewidth=0,
        )


def plot_curves(runs: dict[str, list[dict]], configs: list[MixConfig], window: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    late = all(s.get("late_joiners") for seeds in runs.values() for s in seeds)
    fig, axes = plt.subplots(1, 4 if late else 3, figsize=(22.5 if late else 17, 4.4), dpi=110)
    ax, fax, hax = axes[:3]
    # the format is found within tens of rounds: a short window keeps that visible
    format_window = min(window, FORMAT_WINDOW)
    for config in configs:
        seeds = runs[config.name]
        accuracy = [s["accuracy"]["ma_curve"] for s in seeds]
        _band(ax, list(range(window, window + len(accuracy[0]))), accuracy, config.name)
        formats = [moving_average(s["format_curve"], format_window) for s in seeds]
        _band(fax, list(range(format_window, format_window + len(formats[0]))), formats, config.name)
        heldout = [s["heldout"] for s in seeds if s["heldout"]]
        if heldout and all(len(h) == len(heldout[0]) for h in heldout):
            _band(hax, [r for r, _ in heldout[0]], [[v for _, v in h] for h in heldout], config.name)
    if late:
        plot_late_joiners(axes[3], runs, configs, format_window)
    ax.set_ylabel(f"accuracy: full-credit rate of local completions (MA {window})")
    ax.set_title("accuracy while training")
    fax.set_ylabel(f"<answer> format rate (MA {format_window})")
    fax.set_title("format")
    hax.set_ylabel("held-out greedy accuracy (mean over tasks)")
    hax.set_title("held-out accuracy")
    for axis in (ax, fax, hax):
        axis.set_xlabel("round")
        axis.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_late_joiners(axis, runs: dict[str, list[dict]], configs: list[MixConfig], window: int) -> None:
    """The late joiners' accuracy by round since they joined (solid), and the founders' over
    their own first rounds (dashed): the same warm start, a younger or an older swarm."""
    for config in configs:
        seeds = runs[config.name]
        k = min(s["late_joiners"]["rounds"] for s in seeds)
        w = min(window, k)
        joiners = [moving_average(s["late_joiners"]["mean_curve"][:k], w) for s in seeds]
        x = list(range(w, w + len(joiners[0])))
        _band(axis, x, joiners, f"{config.name} joiners")
        founders = [moving_average(s["accuracy"]["mean_curve"][:k], w) for s in seeds]
        mean = [statistics.fmean(col) for col in zip(*founders)]
        axis.plot(
            x, mean, linestyle="--", linewidth=1.0, color=axis.lines[-1].get_color(), label=f"{config.name} founders"
        )
    join_round = next(iter(runs.values()))[0]["late_joiners"]["join_round"]
    axis.set_xlabel("rounds since joining")
    axis.set_ylabel(f"accuracy (MA {window})")
    axis.set_title(f"late joiners (from round {join_round}) against the founders' first rounds")
    axis.grid(alpha=0.3)
    axis.legend(frameon=False, fontsize=8)
