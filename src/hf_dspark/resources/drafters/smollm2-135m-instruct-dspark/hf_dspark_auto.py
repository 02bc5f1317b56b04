"""Remote-code entry point for transformers' auto classes (written by hf-dspark).

The DSpark drafter is implemented in the hf-dspark package (`pip install hf-dspark`); this file only subclasses its
classes so that `AutoModel.from_pretrained(<this repo>, trust_remote_code=True)` works. Nothing else runs here.
"""

from hf_dspark import DSparkConfig as _DSparkConfig
from hf_dspark import DSparkDrafter as _DSparkDrafter


class DSparkConfig(_DSparkConfig):
    """hf_dspark.DSparkConfig."""


class DSparkDrafter(_DSparkDrafter):
    """hf_dspark.DSparkDrafter; bind it to its target with `drafter.bind_target(target)`."""

    config_class = DSparkConfig
