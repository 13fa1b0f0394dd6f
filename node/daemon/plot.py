"""`sapo-node plot`: reward curves from one or many nodes' metrics.jsonl, one line per node."""

from __future__ import annotations

import json
from pathlib import Path

from sapo.node.daemon.metrics import METRICS_FILE


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to `window` values (shorter at the start, so no curve is empty)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def load_rounds(data_dir: Path) -> list[dict]:
    path = data_dir / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; give node data directories (each holds a metrics.jsonl)")
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return sorted(rows, key=lambda r: r["round"])


def plot_rewards(data_dirs: list[Path], out: Path, window: int = 100, metric: str = "reward_mean") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for data_dir in data_dirs:
        rows = load_rounds(data_dir)
        if not rows:
            continue
        ax.plot([r["round"] for r in rows], moving_average([r[metric] for r in rows], window), label=data_dir.name, lw=1.5)
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
