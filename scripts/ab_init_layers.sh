#!/usr/bin/env bash
# Issue 11 A/B: a fresh 2-layer DSpark drafter with random layers vs layers copied from the target's last two
# decoder layers (--init_from_target_layers); same data order, recipe, seed and budget (scripts/ab_fresh_run.sh),
# 1 thread each, side by side. Held-out τ every 100 steps; logs in runs/ab/<name>.log.
# Usage: STEPS=200 scripts/ab_init_layers.sh   (results: benchmarks/results/init_layers_ab.json)
set -uo pipefail
cd "$(dirname "$0")/.."
export STEPS="${STEPS:-300}"
scripts/ab_fresh_run.sh random &
scripts/ab_fresh_run.sh target_layers --init_from_target_layers True &
wait
for n in random target_layers; do
  echo "$n: $(grep -o "eval_tau_est': '[0-9.]*'" runs/ab/$n.log | tr '\n' ' ')"
done
