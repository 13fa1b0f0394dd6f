"""The study's curves.png: reward (moving average) and format rate per arm, mean ± std over seeds."""

from __future__ import annotations

import statistics
from pathlib import Path

from sapo.node.study.metrics import FORMAT_WINDOW, moving_average
from sapo.node.study.settings import MixConfig


def plot_curves(runs: dict[str, list[dict]], configs: list[MixConfig], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, fax) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=120)
    for config in configs:
        seeds = runs[config.name]
        window = seeds[0]["metrics"]["ma_window"]
        label = "adaptive" if config.adaptive else f"{config.local} local / {config.external} external"
        curves = [s["metrics"]["ma_curve"] for s in seeds]
        # the format is found within tens of rounds: a short window keeps that visible
        format_window = min(window, FORMAT_WINDOW)
        formats = [moving_average(s["metrics"]["format_curve"], format_window) for s in seeds]
        for axis, family, start in ((ax, curves, window), (fax, formats, format_window)):
            mean = [statistics.fmean(col) for col in zip(*family)]
            x = list(range(start, start + len(mean)))
            (line,) = axis.plot(x, mean, label=label, linewidth=1.6, marker="o" if len(mean) < 3 else None)
            if len(family) > 1:
                std = [statistics.stdev(col) for col in zip(*family)]
                axis.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                                  color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_ylabel(f"average reward (moving average, window {window})")
    ax.set_title("SAPO: local/external mix")
    fax.set_ylabel(f"<answer> format rate (moving average, window {format_window})")
    fax.set_title("format discovery")
    for axis in (ax, fax):
        axis.set_xlabel("round")
        axis.grid(alpha=0.3)
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
