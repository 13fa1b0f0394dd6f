"""make run before/after: rounds, round time, update time, from each node's metrics.jsonl."""
import json, re, statistics as st, sys
from datetime import datetime, timezone
from pathlib import Path
log = Path("/work/b24/after.log").read_text()
for arm in ("before", "after"):
    m = re.search(rf"^{arm} (\w+) .* start (\d\d:\d\d:\d\d)$", log, re.M)
    if not m: continue
    start = datetime.strptime(f"2026-12-03 {m.group(2)}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    rows = {p.stem: [json.loads(l) for l in p.read_text().splitlines() if l.strip()] for p in sorted(Path(f"/work/b24/makerun-{arm}").glob("node-*.jsonl"))}
    allr = [r for rs in rows.values() for r in rs[1:]]
    trained = [r for r in allr if r["train_seconds"] >= 0.05]
    first = min(rs[0]["time"] for rs in rows.values() if rs) - start
    lastfirst = max(rs[0]["time"] for rs in rows.values() if rs) - start
    tok = sum(r["generated_tokens"] for r in allr)
    print(f"{arm} ({m.group(1)}): rounds {', '.join(f'{k} {len(v)}' for k, v in rows.items())}; first round {first:.0f} s (all three {lastfirst:.0f} s) after `make run`; "
          f"after each node's first round: median round {st.median(r['round_seconds'] for r in allr):.1f} s, mean {st.mean(r['round_seconds'] for r in allr):.1f} s over {len(allr)} rounds; "
          f"median update {st.median(r['train_seconds'] for r in trained):.1f} s over {len(trained)} rounds that trained (groups {st.mean(r['local_groups']+r['external_groups'] for r in trained):.2f}); "
          f"median generate {st.median(r['generate_seconds'] for r in allr):.1f} s; {tok} tokens generated, {sum(r['generate_seconds'] for r in allr)/max(tok,1)*1000:.1f} ms a token")
