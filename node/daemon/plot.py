"""`sapo-node plot`: reward curves from one or many nodes' metrics.jsonl, one line per node."""

from __future__ import annotations

import json
from pathlib import Path

from sapo.node.core.metrics import METRICS_FILE, moving_average


def load_rounds(data_dir: Path, metric: str) -> list[tuple[int, float]]:
    """(round, metric) of each round, read a line at a time: the whole rows of a long run
    would take ten times the file's size in memory."""
    path = data_dir / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; give node data directories (each holds a metrics.jsonl)")
    points = []
    with path.open() as lines:
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a crash mid-write
            if (
                isinstance(row, dict)
                and isinstance(row.get("round"), int)
                and isinstance(row.get(metric), (int, float))
            ):
                points.append((row["round"], float(row[metric])))
    return sorted(points)


def plot_rewards(data_dirs: list[Path], out: Path, window: int = 100, metric: str = "reward_mean") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for data_dir in data_dirs:
        points = load_rounds(data_dir, metric)
        if not points:
            continue
        ax.plot([r for r, _ in points], moving_average([v for _, v in points], window), label=data_dir.name, lw=1.5)
    ax.set_xlabel("round")
    ax.set_ylabel(f"{metric} ({window}-round moving average)")
    ax.set_title("SAPO node rewards")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
