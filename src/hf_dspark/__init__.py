"""hf-dspark: DSpark speculative decoding for Hugging Face Transformers.

Public API:
    DSparkConfig, DSparkDrafter, DSparkModel (the network alone), DSparkProposal, DSparkDraftCache
    enable / disable (route target.generate(assistant_model=drafter) to the DSpark loop), dspark_generate
    DSparkGenerationStats, DSparkGenerateOutput (a `return_dict_in_generate` output with `dspark_stats`)
    load_default_target, load_default_drafter
"""

from transformers import AutoConfig, AutoModel

from .defaults import load_default_target
from .drafter import DSparkDrafter, load_default_drafter
from .generation import (
    DSparkCandidateGenerator,
    DSparkGenerateOutput,
    DSparkGenerationStats,
    disable,
    dspark_generate,
    enable,
)
from .model.cache import DSparkDraftCache
from .model.configuration_dspark import DSparkConfig
from .model.modeling_dspark import DSparkDrafterOutput, DSparkModel, DSparkProposal
from .version import __version__

# Auto-class registration, as transformers' own model files do on import: the public drafter class.
AutoConfig.register("dspark", DSparkConfig, exist_ok=True)
AutoModel.register(DSparkConfig, DSparkDrafter, exist_ok=True)

__all__ = [
    "DSparkCandidateGenerator",
    "DSparkConfig",
    "DSparkDraftCache",
    "DSparkDrafter",
    "DSparkDrafterOutput",
    "DSparkGenerateOutput",
    "DSparkGenerationStats",
    "DSparkModel",
    "DSparkProposal",
    "__version__",
    "disable",
    "dspark_generate",
    "enable",
    "load_default_drafter",
    "load_default_target",
]
