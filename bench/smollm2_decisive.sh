#!/bin/sh
# Issue #39's pre-registered study: does sharing help a real model? 4 SmolLM2-135M LoRA nodes on
# one shared base, 2-digit basic_arithmetic, completions of up to 64 tokens, 40 rounds, matched
# questions (every arm asks the first I of one list per seed, node and round), held-out greedy and
# sampled pass@1 on 300 questions at round 40. The design, the endpoint and the decision rule:
# bench/results/smollm2-decisive/README.md (committed before the first run).
#
#   bench/smollm2_decisive.sh              # the whole plan, in its order; resumes where it stopped
#   STAGE=design1 SEEDS=2 bench/smollm2_decisive.sh   # one stage, to N seeds
#   START=1 bench/smollm2_decisive.sh      # round 0's held-out (every run's start) for both designs
#
# Design 1 (homogeneous): 4/0+ownpositive (the best isolated recipe) against 2/2+ownpositive, 8
# seeds. Design 2 (specialists): the same arms, node k asking only slice k of the task (+; - of
# one digit; *; three one-digit terms added), every node held out on all four slices (75 each), 4
# seeds. Order: design 1 seeds 0-3, design 2 seeds 0-3, design 1 seeds 4-7, so that an early stop
# leaves paired seeds of both. Runs go arm by arm within a seed, one at a time, at nice 19.
#
# It resumes: Ctrl-C (or a crash, or the machine going away) checkpoints each run after its
# round, and the same command continues where it stopped; runs already done are not run again.
set -eu
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/.cache/smollm2-decisive}
COMMON='--model smollm2-135m --lora --shared-base --tasks basic_arithmetic
  --max-new-tokens 64 --torch-threads 2 --nodes 4 --configs 4/0+ownpositive,2/2+ownpositive
  --rounds 40 --eval-every 40 --eval-samples 4 --run-checkpoint-every 5 --models-dir bench/.cache/models'
TASK='{"basic_arithmetic": {"max_digits": 2}}'
SLICES='[{"operators": ["+"]}, {"operators": ["-"], "max_digits": 1}, {"operators": ["*"]},
  {"operators": ["+"], "min_terms": 3, "max_terms": 3, "max_digits": 1}]'

stage() {  # stage NAME SEEDS: one design's runs up to SEEDS seeds
  case $1 in
    design1) set -- "$2" --eval-questions 300 ;;
    design2) set -- "$2" --eval-questions 75 --slices "$SLICES" ;;
    *) echo "smollm2_decisive.sh: unknown stage $1 (design1, design2)" >&2; exit 2 ;;
  esac
  seeds=$1; shift
  # shellcheck disable=SC2086  # COMMON is a list of flags
  nice -n 19 .venv/bin/sapo-node experiment $COMMON --task-config "$TASK" "$@" \
    --seeds "$seeds" --jobs 1 --out "$OUT/$name"
}

if [ -n "${START:-}" ]; then  # round 0: a LoRA adapter starts at zero, so every run starts here
  # shellcheck disable=SC2086
  nice -n 19 .venv/bin/python bench/study_start.py $COMMON --task-config "$TASK" --eval-questions 300 \
    --json bench/results/smollm2-decisive/start-heldout-design1.jsonl
  # shellcheck disable=SC2086
  nice -n 19 .venv/bin/python bench/study_start.py $COMMON --task-config "$TASK" --eval-questions 75 \
    --slices "$SLICES" --json bench/results/smollm2-decisive/start-heldout-design2.jsonl
  exit 0
fi
if [ -n "${STAGE:-}" ]; then
  name=$STAGE; stage "$STAGE" "${SEEDS:?STAGE needs SEEDS}"
  exit 0
fi
for step in design1:4 design2:4 design1:8; do
  name=${step%%:*}; stage "$name" "${step#*:}"
done
