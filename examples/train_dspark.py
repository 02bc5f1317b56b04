"""Train a DSpark drafter with `DSparkTrainer` (every flag of DSparkTrainConfig and DSparkTrainingArguments works).

Single process, the embedded SmolLM2-135M-Instruct target, a quick smoke run:

    python examples/train_dspark.py --data data/train_regenerated --output_dir runs/smoke \
        --max_examples 64 --max_steps 20 --per_device_train_batch_size 4 --use_cpu --num_threads 1

Several processes / GPUs / nodes: the same command under accelerate (see configs/accelerate/):

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml examples/train_dspark.py \
        --data data/train_regenerated --output_dir runs/dspark --max_steps 4000 --bf16
"""

from hf_dspark.training.train import main

if __name__ == "__main__":
    main()
