"""generate(assistant_model=drafter) integration and the batched DSpark loop."""

from .assistants import oracle_for, prompt_lookup_for, suffix_proposer_for
from .candidate_generator import DSparkCandidateGenerator
from .dispatch import disable, dspark_generate, enable, is_enabled
from .loop import DSparkLoop, dspark_decoding
from .stats import DSparkGenerateOutput, DSparkGenerationStats

__all__ = [
    "DSparkCandidateGenerator",
    "DSparkGenerateOutput",
    "DSparkGenerationStats",
    "DSparkLoop",
    "disable",
    "dspark_decoding",
    "dspark_generate",
    "enable",
    "is_enabled",
    "oracle_for",
    "prompt_lookup_for",
    "suffix_proposer_for",
]
