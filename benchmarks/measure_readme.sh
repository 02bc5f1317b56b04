#!/usr/bin/env bash
# Measure the README's result tables on this machine and regenerate them: batch-1 speed, serving load and the
# accepted length τ at T = 0 and T = 1, each into benchmarks/results/<processor kind>/, then
# benchmarks/readme_tables.py. Run it on a quiet machine; docs/benchmarks.md describes each measurement.
#
#   benchmarks/measure_readme.sh                    # everything (the eval runs take the longest; they resume)
#   ONLY="speed serve" benchmarks/measure_readme.sh # a subset: any of speed serve eval
#   THREADS=1 benchmarks/measure_readme.sh          # torch threads (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-python}"
THREADS="${THREADS:-2}"
ONLY="${ONLY:-speed serve eval}"
KIND="$("$PY" -c "from hf_dspark.provenance import processor_kind; print(processor_kind())")"
OUT="benchmarks/results/$KIND"
SETS=(data/eval/gsm8k.jsonl data/eval/humaneval.jsonl data/eval/mt-bench.jsonl)
DRAFTERS=src/hf_dspark/resources/drafters
mkdir -p "$OUT"
echo "measuring into $OUT ($THREADS threads): $ONLY"

for what in $ONLY; do
  case "$what" in
    speed)
      hf-dspark bench speed --sets "${SETS[@]}" --prompts 3 --max-new-tokens 64 --repeats 3 --block-sizes 7 \
        --threads "$THREADS" --dtype float32 --methods prompt_lookup dspark dspark_auto hybrid hybrid_auto oracle \
        --out "$OUT/speed.json" ;;
    serve)
      hf-dspark bench serve --dtype float32 --threads "$THREADS" --concurrency 1 2 4 8 16 32 --requests 48 \
        --repeats 2 --max-new-tokens 32 --policies none fixed auto --prompts-per-set 3 --hybrid \
        --out "$OUT/serve.json" ;;
    eval)
      for temperature in 0 1; do
        hf-dspark eval --drafters "dspark=$DRAFTERS/smollm2-135m-instruct-dspark" \
          "dflash=$DRAFTERS/smollm2-135m-instruct-dflash" suffix=suffix:7 \
          "hybrid=hybrid:$DRAFTERS/smollm2-135m-instruct-dspark" --prompt-lookup --sets "${SETS[@]}" --limit 40 \
          --max-new-tokens 128 --batch-size 8 --threads "$THREADS" --temperature "$temperature" --sweep \
          --out "$OUT/eval_t$temperature.json"
      done ;;
    *) echo "benchmarks/measure_readme.sh: unknown measurement '$what' (speed, serve, eval)" >&2; exit 2 ;;
  esac
done
"$PY" benchmarks/readme_tables.py
