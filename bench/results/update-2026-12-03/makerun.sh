#!/bin/bash
# make run from a fresh clone, before (BEFORE: by default c5f1391, main before the perf merge)
# and after, one after the other on the same machine, each for MINUTES minutes. Writes
# OUT/starts.txt and each arm's node metrics to OUT/makerun-ARM/; `python3 makerun_summary.py OUT`
# prints makerun.txt from them.
#   MINUTES=6 AFTER=96845ae bash bench/results/update-2026-12-03/makerun.sh
#   OUT=bench/results/update-2026-12-03/bf16 MINUTES=8 BEFORE=68863e4 AFTER=<commit> bash bench/results/update-2026-12-03/makerun.sh
set -u
REPO=${REPO:-$(git rev-parse --show-toplevel)}
OUT=$(mkdir -p "${OUT:-$(dirname "$0")}" && cd "${OUT:-$(dirname "$0")}" && pwd)
MINUTES=${MINUTES:-6}
: > "$OUT/starts.txt"
for arm in "before ${BEFORE:-c5f1391}" "after ${AFTER:-HEAD}"; do
  set -- $arm; name=$1; commit=$2
  dir=$(mktemp -d)
  git clone -q "$REPO" "$dir" && cd "$dir" && git checkout -q "$commit"
  echo "$name $(git rev-parse --short HEAD) $(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$OUT/starts.txt"
  timeout -s INT $((MINUTES * 60)) make run > "$dir/makerun.log" 2>&1  # the console, left in the clone
  mkdir -p "$OUT/makerun-$name"
  for n in sapo-swarm/node-*; do cp "$n/metrics.jsonl" "$OUT/makerun-$name/$(basename "$n").jsonl"; done
  sleep 20
done
