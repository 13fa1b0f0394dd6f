#!/bin/sh
# Issue #32's study: does sharing pay on the real default model? 4 SmolLM2-135M LoRA nodes on one
# shared base, I+J = 4 (4/0, 2/2, adaptive, and the best isolated recipe 4/0+ownpositive), 2-digit
# basic_arithmetic, completions of up to 64 tokens, 60 rounds, held-out greedy accuracy every 20.
# Why these settings: bench/results/smollm2-study/README.md.
#
#   SEEDS=1 bench/smollm2_study.sh     # seed 0 of every arm; then SEEDS=2, SEEDS=3
#   START=bench/results/smollm2-study/start-heldout.jsonl bench/smollm2_study.sh   # round 0's held-out
#
# It resumes: Ctrl-C (or a crash, or the machine going away) checkpoints each run after its
# round, and the same command continues where it stopped. A study extends by seeds, and runs go
# arm by arm within a seed, so the seeds done so far pair. About 26 s a round on 2 cores
# (18 s for 4/0+ownpositive), 26 min a run, 1.75 h a seed: 5.3 h for the 3 seeds.
set -eu
cd "$(dirname "$0")/.."
set -- --model smollm2-135m --lora --shared-base \
  --tasks basic_arithmetic --task-config '{"basic_arithmetic": {"max_digits": 2}}' \
  --max-new-tokens 64 --torch-threads 2 --eval-every 20 \
  --nodes 4 --configs 4/0,2/2,adaptive,4/0+ownpositive --rounds 60 \
  --run-checkpoint-every 5 --models-dir bench/.cache/models
if [ -n "${START:-}" ]; then  # START=FILE: held-out accuracy at round 0, every run's start, into FILE
  exec nice -n 19 .venv/bin/python bench/study_start.py "$@" --json "$START"
fi
exec nice -n 19 .venv/bin/sapo-node experiment "$@" --seeds "${SEEDS:-3}" --jobs 1 --out "${OUT:-bench/.cache/smollm2-study2}"
