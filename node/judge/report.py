"""`sapo-node judge report`: a per-peer leaderboard and a PNG of judged score over time.

The x axis is normalised rounds (a result's node_round / that peer's largest judged round), so
peers that ran for different lengths share one axis, as in the paper's demo figure. Peers that
ever reported a swarm peer seen or an external group trained on are "swarm"; the rest are
"isolated". Each class gets its points and a moving average of its scores in x order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sapo.node.core.metrics import moving_average
from sapo.node.judge.server import DB_FILE_NAME, load_results


def is_swarm_peer(rows: list[dict[str, Any]]) -> bool:
    return any(r["swarm_peers_seen"] > 0 or r["external_groups"] > 0 for r in rows)


def by_peer(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    peers: dict[str, list[dict[str, Any]]] = {}
    for row in results:
        peers.setdefault(row["peer_id"], []).append(row)
    return peers


def leaderboard(results: list[dict[str, Any]]) -> str:
    """One line per peer, best mean score first."""
    lines = []
    for peer, rows in by_peer(results).items():
        scores = [r["score"] for r in rows]
        recent = scores[-10:]
        lines.append(
            (
                sum(scores) / len(scores),
                f"{peer:<54} {rows[-1]['model_id'][:16]:<16} {'swarm' if is_swarm_peer(rows) else 'isolated':<8} "
                f"{len(rows):>6} {max(r['node_round'] for r in rows):>7} "
                f"{sum(scores) / len(scores):>6.3f} {sum(recent) / len(recent):>7.3f}",
            )
        )
    header = f"{'rank':>4} {'peer':<54} {'model':<16} {'kind':<8} {'judged':>6} {'round':>7} {'mean':>6} {'last10':>7}"
    body = [f"{i:>4} {line}" for i, (_, line) in enumerate(sorted(lines, key=lambda x: -x[0]), start=1)]
    return "\n".join([header, *body]) if body else "no results yet"


def plot_judged(results: list[dict[str, Any]], out: Path, window: int = 20) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes: dict[str, list[tuple[float, float]]] = {"swarm": [], "isolated": []}
    for rows in by_peer(results).values():
        last = max(r["node_round"] for r in rows) or 1
        kind = "swarm" if is_swarm_peer(rows) else "isolated"
        classes[kind].extend((r["node_round"] / last, r["score"]) for r in rows)

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for kind, color in (("swarm", "tab:blue"), ("isolated", "tab:orange")):
        points = sorted(classes[kind])
        if not points:
            continue
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        ax.scatter(xs, ys, s=8, alpha=0.25, color=color)
        ax.plot(xs, moving_average(ys, window), color=color, lw=2, label=f"{kind} peers ({len(points)} results)")
    ax.set_xlabel("normalised rounds (round / the peer's last judged round)")
    ax.set_ylabel(f"judged pass@1 score ({window}-result moving average)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("SAPO open judge")
    ax.grid(alpha=0.3)
    if any(classes.values()):
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def judge_report(data_dir: Path, out: Path, window: int = 20) -> str:
    """The leaderboard text; writes the PNG to `out`."""
    if window < 1:
        raise ValueError("--window must be at least 1")
    results = load_results(Path(data_dir) / DB_FILE_NAME)
    plot_judged(results, out, window)
    return leaderboard(results)
