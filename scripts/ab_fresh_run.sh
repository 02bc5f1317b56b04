#!/usr/bin/env bash
# One fresh drafter for the from-scratch A/B scripts (ab_init_layers.sh, ab_depth.sh): the v2 recipe (dense anchors,
# bf16 autocast, 8,192-token draft vocabulary), lr 6e-4 cosine over STEPS steps x 2 sequences, seed 0, 1 thread,
# held-out τ every 100 steps. The flags after the name choose the architecture (they override the defaults here).
# Log: runs/ab/<name>.log.   Usage: STEPS=700 scripts/ab_fresh_run.sh NAME [--flag value ...]
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python}"
STEPS="${STEPS:-300}"
name="$1"; shift
export OMP_NUM_THREADS=1
mkdir -p runs/ab
"$PY" -m hf_dspark.training --data data/train_regenerated --output_dir "runs/ab/$name" --resume_from_checkpoint auto \
  --num_hidden_layers 2 --block_size 7 --markov_rank 64 --mask_token_id 16 --head_type markov \
  --target_dtype bfloat16 --bf16 True --use_cpu True --draft_vocab_size 8192 --anchors_per_sequence 512 \
  --per_device_train_batch_size 2 --max_steps "$STEPS" --learning_rate 6e-4 --lr_scheduler_type cosine \
  --warmup_steps 10 --weight_decay 0.0 --validation_fraction 0.004 --eval_strategy steps --eval_steps 100 \
  --per_device_eval_batch_size 4 --save_strategy steps --save_steps 100 --save_total_limit 1 --logging_steps 10 \
  --train_sampling_strategy group_by_length --num_threads 1 --report_to none --seed 0 --validation_seed 0 "$@" \
  > "runs/ab/$name.log" 2>&1
