#!/bin/bash
# make run from a fresh clone, before (main before the perf merge) and after (main now), one after
# the other on the same machine, each for MINUTES minutes; the nodes' metrics.jsonl kept.
MINUTES=${MINUTES:-7}
for arm in "before c5f1391" "after ${AFTER:-HEAD}"; do
  set -- $arm; name=$1; commit=$2
  dir=/tmp/mr-$name; rm -rf $dir
  git clone -q /work/main $dir && cd $dir && git checkout -q $commit
  echo "$name $(git log --oneline -1) start $(date -u +%T)"
  start=$(date +%s)
  timeout -s INT $((MINUTES * 60)) make run > /work/b24/makerun-$name.log 2>&1
  echo "$name stopped after $(( $(date +%s) - start )) s"
  mkdir -p /work/b24/makerun-$name
  for n in sapo-swarm/node-*; do cp $n/metrics.jsonl /work/b24/makerun-$name/$(basename $n).jsonl 2>/dev/null; done
  sleep 20
done
