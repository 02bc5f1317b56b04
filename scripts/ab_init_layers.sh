#!/usr/bin/env bash
# Issue 11 A/B: a fresh 2-layer DSpark drafter with random layers vs layers copied from the target's last two
# decoder layers (--init_from_target_layers); same data order, recipe (dense anchors, bf16 autocast, 8,192-token
# draft vocabulary), seed and budget (STEPS cosine steps), 1 thread each, side by side. Held-out τ every 100 steps;
# logs in runs/ab/<name>.log.   Usage: STEPS=200 scripts/ab_init_layers.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python}"
STEPS="${STEPS:-300}"
export OMP_NUM_THREADS=1
run() {  # name, extra flags
  local name="$1"; shift
  "$PY" -m hf_dspark.training --data data/train_regenerated --output_dir runs/ab/$name --resume_from_checkpoint auto \
    --num_hidden_layers 2 --block_size 7 --markov_rank 64 --mask_token_id 16 --head_type markov \
    --target_dtype bfloat16 --bf16 True --use_cpu True --draft_vocab_size 8192 --anchors_per_sequence 512 \
    --per_device_train_batch_size 2 --max_steps "$STEPS" --learning_rate 6e-4 --lr_scheduler_type cosine \
    --warmup_steps 10 --weight_decay 0.0 --validation_fraction 0.004 --eval_strategy steps --eval_steps 100 \
    --per_device_eval_batch_size 4 --save_strategy steps --save_steps 100 --save_total_limit 1 --logging_steps 10 \
    --train_sampling_strategy group_by_length --num_threads 1 --report_to none --seed 0 --validation_seed 0 "$@" \
    > runs/ab/$name.log 2>&1
}
mkdir -p runs/ab
run random &
run target_layers --init_from_target_layers True &
wait
for n in random target_layers; do
  echo "$n: $(grep -o "eval_tau_est': '[0-9.]*'" runs/ab/$n.log | tr '\n' ' ')"
done
