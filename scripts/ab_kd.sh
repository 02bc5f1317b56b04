#!/usr/bin/env bash
# Issue 11: does a distillation term (--alpha_kd, KL(p_target || p_draft), losses.kd_loss) lift the shipped DSpark
# drafter off its plateau? Two runs warm-started from the shipped drafter, side by side with 1 thread each, the same
# data order, seed, schedule and held-out split; they differ only in --alpha_kd (0: the paper's objective, as v2-v5
# trained; KD, default 1). fp32 (target and drafter), so it runs on CPUs without native bf16; on a bf16 CPU pass
# DTYPE_FLAGS="--target_dtype bfloat16 --bf16 True". Held-out τ every EVAL steps; logs in runs/ab/<name>.log.
# Usage: STEPS=300 KD=1.0 scripts/ab_kd.sh     (results: benchmarks/results/kd_ab.json via scripts/ab_summary.py)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python}"
STEPS="${STEPS:-300}"
EVAL="${EVAL:-50}"
KD="${KD:-1.0}"
INIT="${INIT:-src/hf_dspark/resources/drafters/smollm2-135m-instruct-dspark}"
DTYPE_FLAGS="${DTYPE_FLAGS:---target_dtype float32}"
export OMP_NUM_THREADS=1
mkdir -p runs/ab
run() {  # name alpha_kd
  # shellcheck disable=SC2086
  "$PY" -m hf_dspark.training --data data/train_regenerated --output_dir "runs/ab/$1" --resume_from_checkpoint auto \
    --init_drafter "$INIT" $DTYPE_FLAGS --use_cpu True --draft_vocab_size 8192 --anchors_per_sequence 512 \
    --per_device_train_batch_size 2 --max_steps "$STEPS" --learning_rate 2e-4 --lr_scheduler_type cosine \
    --warmup_steps 20 --weight_decay 0.0 --validation_fraction 0.004 --eval_strategy steps --eval_steps "$EVAL" \
    --per_device_eval_batch_size 4 --save_strategy steps --save_steps 25 --save_total_limit 2 --logging_steps 5 \
    --train_sampling_strategy group_by_length --num_threads 1 --report_to none --seed 4 --validation_seed 0 \
    --alpha_kd "$2" > "runs/ab/$1.log" 2>&1
}
run kd_off 0 &
run kd_on "$KD" &
wait
for n in kd_off kd_on; do
  echo "$n: $(grep -o "eval_tau_est': '[0-9.]*'" "runs/ab/$n.log" | tr '\n' ' ')"
done
