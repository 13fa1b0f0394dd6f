"""Summaries of bench/poisoning.py runs, rebuilt from their raw rows: the attack's success per
window of rounds, the honest nodes' accuracy, the screen's operating point and its ROC, and one
plot of success over rounds.

    .venv/bin/python -m bench.poisoning_report bench/results/poisoning-2026-12-04
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def rows_of(run: Path, name: str) -> list[dict]:
    for candidate in (run / f"{name}.jsonl.gz", run / f"{name}.jsonl"):
        if candidate.exists():
            return read_jsonl(candidate)
    return []


def windows(rows: list[dict], width: int, value, after: int = 0) -> list[float]:
    """Per window of `width` rounds after round `after`, the pooled value over every honest
    node's rounds in it."""
    last = max(r["round"] for r in rows)
    out = []
    for start in range(after, last, width):
        inside = [r for r in rows if start < r["round"] <= start + width]
        out.append(value(inside))
    return out


def success(rows: list[dict]) -> float:
    """Share of the honest nodes' own completions that show the attack."""
    completions = sum(r["completions"] for r in rows)
    return sum(r["attack_shown"] for r in rows) / completions if completions else 0.0


def accuracy(rows: list[dict]) -> float:
    return sum(r["accuracy"] for r in rows) / len(rows) if rows else 0.0


def operating_point(rows: list[dict]) -> dict[str, float]:
    """What the screen did in the run: attackers' chosen groups refused, honest chosen groups refused."""
    attack_refused = sum(r["refused_attackers"] for r in rows)
    attack_chosen = attack_refused + sum(r["from_attackers"] for r in rows)
    honest_refused = sum(r["screened_out"] - r["refused_attackers"] for r in rows)
    honest_chosen = honest_refused + sum(r["external_groups"] - r["from_attackers"] for r in rows)
    return {
        "attack_groups_chosen": attack_chosen,
        "attack_refused": attack_refused / attack_chosen if attack_chosen else 0.0,
        "honest_groups_chosen": honest_chosen,
        "honest_refused": honest_refused / honest_chosen if honest_chosen else 0.0,
        "external_per_round": sum(r["external_groups"] for r in rows) / len(rows),
        "attack_trained_per_round": sum(r["from_attackers"] for r in rows) / len(rows),
    }


def roc(probes: list[dict]) -> tuple[list[tuple[float, float, float]], float]:
    """(threshold, false positive rate, true positive rate) over every probed score, and the AUC."""
    honest = sorted(p["score"] for p in probes if p["label"] == "honest")
    attack = sorted(p["score"] for p in probes if p["label"] == "attack")
    if not honest or not attack:
        return [], float("nan")
    points = []
    for threshold in sorted({*honest, *attack, float("inf")}):
        fpr = sum(s > threshold for s in honest) / len(honest)
        tpr = sum(s > threshold for s in attack) / len(attack)
        points.append((threshold, fpr, tpr))
    # AUC: the chance that an attack completion scores above an honest one (ties count half)
    wins = sum((a > h) + 0.5 * (a == h) for a in attack for h in honest)
    return points, wins / (len(attack) * len(honest))


def j_filled(rows: list[dict]) -> float:
    """External groups the honest nodes trained on, as a share of the J they planned."""
    planned = sum(r["external_planned"] for r in rows)
    return sum(r["external_groups"] for r in rows) / planned if planned else 0.0


def summarize(run: Path, width: int) -> dict:
    command = json.loads((run / "command.json").read_text())
    rows, probes = rows_of(run, "rows"), rows_of(run, "probes")
    clean_rounds = int(command.get("clean_rounds", 0))
    # a patient attacker's rounds (all of them for one that attacks at once); with no attacker,
    # the rounds an attacker would have attacked in, for the same comparison
    attacking = [r for r in rows if r["round"] > clean_rounds]
    _, auc = roc(probes)
    honest = [p["score"] for p in probes if p["label"] == "honest"]
    attack = [p["score"] for p in probes if p["label"] == "attack"]
    return {
        "run": run.name,
        "attack": command["attack"],
        "defences": command["defences"],
        "clean_rounds": clean_rounds,
        # the honest nodes' verifier, where the run names one (runs before --verifier: the node's)
        **({"verifier": command["verifier"]} if "verifier" in command else {}),
        "share": f"{command['attackers']}/{int(command['honest']) + int(command['attackers'])}",
        "rounds": max(r["round"] for r in rows),
        "success": windows(rows, width, success),
        "accuracy": windows(rows, width, accuracy),
        "final_success": success([r for r in rows if r["round"] > max(r["round"] for r in rows) - width]),
        "final_by_node": [
            success([r for r in rows if r["node"] == n and r["round"] > max(r["round"] for r in rows) - width])
            for n in sorted({r["node"] for r in rows})
        ],
        "attacking_rounds": len({r["round"] for r in attacking}),
        "attacking_success": success(attacking),
        "attacking_worst_window": max(windows(attacking, width, success, clean_rounds)) if attacking else 0.0,
        "j_filled_attacking": j_filled(attacking),
        **operating_point(rows),
        "auc": auc,
        "honest_max": max(honest, default=float("nan")),
        "attack_min": min(attack, default=float("nan")),
    }


def setting(s: dict) -> str:
    """The defences, and the verifier where it is not the node's own."""
    verifier = s.get("verifier", "node")
    patient = f", patient: clean for {s['clean_rounds']} rounds" if s.get("clean_rounds") else ""
    return (s["defences"] if verifier == "node" else f"{s['defences']}, {verifier} verifier") + patient


def table(summaries: list[dict], width: int) -> str:
    lines = [
        f"| run | attack | attackers | defences | rounds | success per {width} rounds | last {width} (each node) | "
        f"honest accuracy per {width} rounds | external groups a round (from attackers) | attackers' chosen groups "
        "refused | honest chosen groups refused | ROC AUC (honest max / attack min score) | attacking rounds: success "
        f"(worst {width}) | J filled |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s['run']} | {s['attack']} | {s['share']} | {setting(s)} | {s['rounds']} | "
            f"{' '.join(f'{v:.2f}' for v in s['success'])} | **{s['final_success']:.3f}** "
            f"({' '.join(f'{v:.2f}' for v in s['final_by_node'])}) | "
            f"{' '.join(f'{v:.2f}' for v in s['accuracy'])} | {s['external_per_round']:.2f} ({s['attack_trained_per_round']:.2f}) | "
            f"{s['attack_refused']:.3f} of {s['attack_groups_chosen']} | {s['honest_refused']:.3f} of {s['honest_groups_chosen']} | "
            f"{s['auc']:.3f} ({s['honest_max']:.1f} / {s['attack_min']:.1f}) | "
            f"{s['attacking_success']:.3f} ({s['attacking_worst_window']:.3f}) over {s['attacking_rounds']} | "
            f"{s['j_filled_attacking']:.3f} |"
        )
    return "\n".join(lines)


def plot(runs: list[Path], summaries: list[dict], width: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attacks = sorted({s["attack"] for s in summaries})
    fig, axes = plt.subplots(1, len(attacks), figsize=(6 * len(attacks), 4), squeeze=False)
    for ax, attack in zip(axes[0], attacks):
        for run, s in zip(runs, summaries):
            if s["attack"] != attack:
                continue
            rows = rows_of(run, "rows")
            step = 25
            xs = list(range(step, s["rounds"] + 1, step))
            ys = [success([r for r in rows if x - step < r["round"] <= x]) for x in xs]
            style = "-" if setting(s) == "on" else "--"
            colour = {"1/8": "tab:green", "1/4": "tab:blue", "2/4": "tab:red"}.get(s["share"], "tab:grey")
            ax.plot(xs, ys, style, color=colour, label=f"{s['share']} attackers, defences {setting(s)}")
        ax.axhline(0.05, color="grey", lw=0.8, ls=":")
        ax.set_title(f"{attack} attack")
        ax.set_xlabel("round")
        ax.set_ylabel("attack success (share of own completions)")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "results", type=Path, help="a folder of run folders (each with command.json and rows.jsonl[.gz])"
    )
    parser.add_argument("--window", type=int, default=100)
    args = parser.parse_args(argv)
    runs = sorted(p for p in args.results.iterdir() if (p / "command.json").exists())
    summaries = [summarize(run, args.window) for run in runs]
    text = table(summaries, args.window)
    (args.results / "summary.md").write_text(text + "\n")
    (args.results / "summary.json").write_text(json.dumps(summaries, indent=1) + "\n")
    plot(runs, summaries, args.window, args.results / "poisoning.png")
    print(text)


if __name__ == "__main__":
    main()
