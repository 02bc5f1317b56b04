"""hf-dspark: DSpark speculative decoding for Hugging Face Transformers.

Public API:
    DSparkConfig, DSparkDrafter, DSparkProposal, DSparkDraftCache
    enable / disable (route target.generate(assistant_model=drafter) to the DSpark loop), dspark_generate
    load_default_target, load_default_drafter
"""

from transformers import AutoConfig, AutoModel

from .defaults import load_default_drafter, load_default_target
from .model.cache import DSparkDraftCache
from .model.configuration_dspark import DSparkConfig
from .model.drafter_hooks import HOOKS
from .model.modeling_dspark import DSparkDrafter, DSparkDrafterOutput, DSparkProposal
from .profiling.curve_sources import CURVE_SOURCES
from .version import __version__

# Auto-class registration, as transformers' own model files do on import.
AutoConfig.register("dspark", DSparkConfig, exist_ok=True)
AutoModel.register(DSparkConfig, DSparkDrafter, exist_ok=True)


# The drafter's calls into the layers above `modeling_dspark`, passed in here (imported on first use, to keep
# `import hf_dspark` light): loading other layouts, the Hub shim, `generate` routing, the last call's statistics.
def _load_drafter(*args, **kwargs):
    from .interop.loading import load_drafter

    return load_drafter(*args, **kwargs)


def _add_remote_code(folder) -> None:
    from .interop.hub import add_remote_code

    add_remote_code(folder)


def _enable_generate(target) -> None:
    from .generation.dispatch import enable

    enable(target)


def _last_generation_stats(drafter):
    from .generation.stats import last_generation_stats

    return last_generation_stats(drafter)


HOOKS.load_drafter = _load_drafter
HOOKS.add_remote_code = _add_remote_code
HOOKS.enable_generate = _enable_generate
HOOKS.last_generation_stats = _last_generation_stats


# The cost curves `generate` and the engine look up when the caller passes none (profiling sits above generation).
def _step_curve(target, packed_weights):
    from .profiling.target_steps import load_or_profile_step_curve

    return load_or_profile_step_curve(target, packed_weights=packed_weights)


def _draft_curve(drafter):
    from .profiling.draft_steps import load_or_profile_draft_curve

    return load_or_profile_draft_curve(drafter)


CURVE_SOURCES.step_curve = _step_curve
CURVE_SOURCES.draft_curve = _draft_curve


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
