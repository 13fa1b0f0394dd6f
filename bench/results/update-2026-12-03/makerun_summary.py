"""makerun.txt from what makerun.sh wrote: each arm's start time and its nodes' metrics.jsonl.

    python3 bench/results/update-2026-12-03/makerun_summary.py [DIR]   # DIR: this folder by default
"""
import json
import statistics as st
import sys
from datetime import datetime
from pathlib import Path

here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
for line in (here / "starts.txt").read_text().splitlines():
    arm, commit, stamp = line.split()
    start = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    rows = {p.stem: [json.loads(l) for l in p.read_text().splitlines() if l.strip()]
            for p in sorted((here / f"makerun-{arm}").glob("node-*.jsonl"))}
    later = [r for rs in rows.values() for r in rs[1:]]  # each node's first round includes loading
    trained = [r for r in later if r["train_seconds"] >= 0.05]
    firsts = [rs[0]["time"] - start for rs in rows.values() if rs]
    tokens = sum(r["generated_tokens"] for r in later)
    print(f"{arm} ({commit}): rounds {', '.join(f'{k} {len(v)}' for k, v in rows.items())}; "
          f"first round {min(firsts):.0f} s (all three {max(firsts):.0f} s) after `make run`; "
          f"after each node's first round: median round {st.median(r['round_seconds'] for r in later):.1f} s, "
          f"mean {st.mean(r['round_seconds'] for r in later):.1f} s over {len(later)} rounds; "
          f"median update {st.median(r['train_seconds'] for r in trained):.1f} s over {len(trained)} rounds that trained "
          f"(groups {st.mean(r['local_groups'] + r['external_groups'] for r in trained):.2f}; "
          f"{sum(r['train_seconds'] for r in trained) / sum(r['update_tokens'] for r in trained) * 1000:.0f} ms "
          f"of update a completion token trained); "
          f"median generate {st.median(r['generate_seconds'] for r in later):.1f} s; {tokens} tokens generated, "
          f"{sum(r['generate_seconds'] for r in later) / max(tokens, 1) * 1000:.1f} ms a token")
