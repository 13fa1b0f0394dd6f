"""How many of a study's own questions a node had been sent by a peer first (issue #42).

ReasoningGYM draws item `index` of a dataset seeded `seed` from Random(seed + index), so a question
is the point `stream start + index` of one shared sequence. A node's stream starts at its seed
times `--stride`: 1 for studies made before `question_stream` (training/problems/tasks.py), 2^31
since. From each row's `asked` (dataset#index) and its node's seed (the study's `--seed + 1000 s + k`),
this prints the share of the nodes' questions that a peer of the same run had asked in an earlier
round.

    python -m bench.question_overlap bench/results/tiny-heterogeneous-streams            # 0.0 %
    python -m bench.question_overlap bench/results/tiny-heterogeneous-streams/diagnosis/unmatched --stride 1
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def rows_of(study: Path) -> list[dict]:
    """A study's raw rows: its --out's raw.jsonl, or a committed result's raw.jsonl.gz."""
    plain = study / "raw.jsonl"
    text = plain.read_text() if plain.exists() else gzip.decompress((study / "raw.jsonl.gz").read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def previewed_share(rows: list[dict], base_seed: int, stride: int) -> tuple[int, int]:
    """(questions asked, of them asked by another node of the same run in an earlier round)."""
    runs: dict[int, list[tuple[int, int, list[int]]]] = {}  # seed -> (round, node, points)
    for row in rows:
        start = (base_seed + 1000 * row["seed"] + row["node"]) * stride
        points = [start + int(a.split("#")[1]) for a in row.get("asked") or []]
        runs.setdefault(row["seed"], []).append((row["round"], row["node"], points))
    total = previewed = 0
    for asked in runs.values():
        first: dict[int, tuple[int, int]] = {}  # point -> (round, node) it was first asked in
        for round_, node, points in sorted(asked):
            for point in points:
                total += 1
                seen = first.get(point)
                previewed += seen is not None and seen[0] < round_ and seen[1] != node
                first.setdefault(point, (round_, node))
    return total, previewed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="a study's --out, or a committed result (raw.jsonl[.gz])")
    parser.add_argument("--stride", type=int, default=2**31, help="a seed's stream start per unit of seed")
    parser.add_argument("--config", default="adaptive", help="the arm")
    args = parser.parse_args()
    # a study's seeds count from --seed, or 0 where it was unset (node/study/nodes.py's base_seed)
    base_seed = json.loads((args.study / "study-settings.json").read_text())["node"]["seed"] or 0
    rows = [row for row in rows_of(args.study) if row["config"] == args.config]
    total, previewed = previewed_share(rows, base_seed, args.stride)
    print(
        f"{args.config}: {total} questions asked, {previewed / max(1, total):.1%} asked by a peer in an earlier round"
    )


if __name__ == "__main__":
    main()
