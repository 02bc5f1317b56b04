"""hf-dspark: DSpark speculative decoding for Hugging Face Transformers.

Public API:
    DSparkConfig, DSparkDrafter, DSparkProposal, DSparkDraftCache
    enable / disable (route target.generate(assistant_model=drafter) to the DSpark loop), dspark_generate
    load_default_target, load_default_drafter
"""

from transformers import AutoConfig, AutoModel

from .cache import DSparkDraftCache
from .configuration_dspark import DSparkConfig
from .defaults import load_default_drafter, load_default_target
from .modeling_dspark import DSparkDrafter, DSparkDrafterOutput, DSparkProposal

__version__ = "0.1.0"

# Auto-class registration, as transformers' own model files do on import.
AutoConfig.register("dspark", DSparkConfig, exist_ok=True)
AutoModel.register(DSparkConfig, DSparkDrafter, exist_ok=True)


def __getattr__(name: str):
    # Generation entry points are imported lazily to keep `import hf_dspark` light.
    if name in {"enable", "disable", "dspark_generate", "DSparkCandidateGenerator", "DSparkGenerationStats"}:
        from . import generation

        return getattr(generation, name)
    raise AttributeError(f"module 'hf_dspark' has no attribute {name!r}")


__all__ = [
    "DSparkCandidateGenerator",
    "DSparkConfig",
    "DSparkDraftCache",
    "DSparkDrafter",
    "DSparkDrafterOutput",
    "DSparkGenerationStats",
    "DSparkProposal",
    "__version__",
    "disable",
    "dspark_generate",
    "enable",
    "load_default_drafter",
    "load_default_target",
]
