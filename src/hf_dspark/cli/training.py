"""`hf-dspark prepare-data` and `hf-dspark train`: HfArgumentParser over the library's config dataclasses.

Their options are the dataclass fields (underscored, as in `transformers` scripts: `--output_dir`), so the same
flags work for `python -m hf_dspark.training` and `accelerate launch -m hf_dspark.training`.
"""

from __future__ import annotations

from collections.abc import Sequence

PREPARE_DATA_HELP = "regenerate training replies with the target (prepare-data --help lists the options)"
TRAIN_HELP = "train a drafter with transformers.Trainer (train --help lists the options)"


def prepare_data_parser():
    """The `hf-dspark prepare-data` parser: every `PrepareDataConfig` field is an option."""
    from transformers import HfArgumentParser

    from ..training.regenerate import PrepareDataConfig

    return HfArgumentParser(PrepareDataConfig, prog="hf-dspark prepare-data",
                            description="Regenerate every assistant turn of prompt JSONL files with the target "
                            "itself (sharded, resumable).")


def train_parser():
    """The `hf-dspark train` parser: every `DSparkTrainConfig` and `DSparkTrainingArguments` field is an option."""
    from transformers import HfArgumentParser

    from ..training.train import DSparkTrainConfig
    from ..training.trainer import DSparkTrainingArguments

    return HfArgumentParser((DSparkTrainConfig, DSparkTrainingArguments), prog="hf-dspark train",
                            description="Train a DSpark drafter against a frozen target with transformers.Trainer.")


def run_prepare_data(argv: Sequence[str]) -> int:
    from transformers.utils import logging

    from ..training.regenerate import prepare_data

    parser = prepare_data_parser()
    (config,) = _parse_into_dataclasses(parser, argv)
    logging.get_logger(__name__).warning(f"regenerated conversations are in {prepare_data(config)}")
    return 0


def run_train(argv: Sequence[str]) -> int:
    from ..training.train import train

    train(*_parse_into_dataclasses(train_parser(), argv))
    return 0


def _parse_into_dataclasses(parser, argv: Sequence[str]):
    """Parse; a config's `__post_init__` ValueError becomes a usage error naming the problem (exit status 2)."""
    try:
        return parser.parse_args_into_dataclasses(args=list(argv))
    except ValueError as error:
        parser.error(str(error))
