#!/usr/bin/env bash
# Issue 11, the paper's depth claim: a fresh 2-layer DSpark drafter (Markov head) vs a fresh 4-layer DFlash-style
# baseline (head none), same data order, recipe, seed and steps (scripts/ab_fresh_run.sh), 1 thread each, side by
# side. The deeper baseline costs more per step, so at equal steps it has had more compute (the logs' cpu_hours).
# Held-out τ every 100 steps; logs in runs/ab/<name>.log.
# Usage: STEPS=700 scripts/ab_depth.sh   (results: benchmarks/results/depth_ab.json)
set -uo pipefail
cd "$(dirname "$0")/.."
export STEPS="${STEPS:-700}"
scripts/ab_fresh_run.sh dspark_2l &
scripts/ab_fresh_run.sh dflash_4l --num_hidden_layers 4 --head_type none --confidence_with_markov false &
wait
for n in dspark_2l dflash_4l; do
  echo "$n: $(grep -o "eval_tau_est': '[0-9.]*'" runs/ab/$n.log | tr '\n' ' ')"
done
