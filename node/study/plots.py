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
        axis.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                          color=line.get_color(), alpha=0.15, linewidth=0)


def plot_curves(runs: dict[str, list[dict]], configs: list[MixConfig], window: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, fax, hax) = plt.subplots(1, 3, figsize=(17, 4.4), dpi=110)
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
