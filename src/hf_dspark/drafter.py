"""`DSparkDrafter`, the drafter the package ships: the network (`DSparkModel`) and what needs the layers above it.

`hf_dspark.model.modeling_dspark.DSparkModel` is the network alone (forward, `propose`, caches, the target's shared
embedding and LM head, native `from_pretrained` / `save_pretrained`). `DSparkDrafter` sits above the loop and
interop, so it imports them rather than being handed them:

- `from_pretrained` also reads the serving-engine, SpecForge, DFlash and speculators layouts
  (`hf_dspark.interop.loading.load_drafter`);
- `save_pretrained` also writes the Hub remote-code shim and `auto_map` (`hf_dspark.interop.hub.add_remote_code`);
- `bind_target` also routes `target.generate(assistant_model=drafter)` to the DSpark loop
  (`hf_dspark.generation.dispatch.enable`);
- as a `DraftModel` it keeps the last call's statistics (`last_generation_stats`).

`AutoModel` is registered with this class, and saved folders name it (`architectures: ["DSparkDrafter"]`).
`load_default_drafter` builds it for the shipped drafters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn
from transformers import PreTrainedModel

from .defaults import DEFAULT_DRAFTER_KINDS, default_drafter_dir
from .generation.dispatch import enable
from .interop.hub import add_remote_code
from .interop.loading import load_drafter
from .model.modeling_dspark import DSparkModel, generating_model
from .proposers import hybrid_for
from .proposers.base import DraftModel

__all__ = ["DSparkDrafter", "load_default_drafter"]


class DSparkDrafter(DSparkModel, DraftModel):
    """The DSpark drafter: bind it to its target (`bind_target`, or `from_pretrained(path, target=...)`), then
    `target.generate(**inputs, assistant_model=drafter)`; `drafter.last_generation_stats` describes the last call."""

    def save_pretrained(self, save_directory, *args: Any, **kwargs: Any):
        """`DSparkModel.save_pretrained` (safetensors, no target embedding/LM head), plus `auto_map` and the small
        remote-code shim, so `AutoModel.from_pretrained(folder, trust_remote_code=True)` works on the Hub."""
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            add_remote_code(save_directory)
        return result

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, target: nn.Module | None = None, **kw):
        """Load a drafter (native, or the serving-engine / SpecForge / DFlash / speculators layouts, see
        `hf_dspark.interop.loading`) and bind it to `target` when given."""
        return load_drafter(cls, pretrained_model_name_or_path, *args, target=target, **kw)

    def bind_target(self, target: PreTrainedModel) -> DSparkDrafter:
        """Share the target's frozen embedding and LM head; move to its device and dtype; route its `generate`
        (`hf_dspark.enable`)."""
        super().bind_target(target)
        enable(generating_model(target))
        return self


def load_default_drafter(target, path: str | Path | None = None, variant: str = "dspark", kind: str = "hybrid"):
    """The shipped drafter for the default target, bound to `target`.

    kind: "hybrid" (default) wraps the drafter in a `HybridDrafter`: per request and round it drafts with the
        DSpark drafter or copies from the request's own context (prompt lookup), the source chosen from the
        committed context and lagged per-source acceptance only, so generation stays lossless. On the dev sets
        (first 40 prompts of gsm8k, humaneval and mt-bench, γ = 7) it measures the highest accepted length: macro
        τ 2.31 at T = 0 and 1.63 at T = 1, against 1.71 / 1.55 for the DSpark drafter alone and 1.82 / 1.24 for
        prompt lookup alone (`benchmarks/results/x86_64--AVX512--bf16/eval_t0.json`, `eval_t1.json`). "dspark": the
        drafter alone (a `DSparkDrafter`, what training, calibration and export take).
    variant: "dspark" (default) is the DSpark drafter (Markov head, calibrated confidence head); "dflash" the
        DFlash-style baseline trained with the same data, layers and steps. `path` overrides both.

    Raises FileNotFoundError naming the folder when no trained drafter ships in this installation, and ValueError
    for an unknown `kind`.
    """
    if kind not in DEFAULT_DRAFTER_KINDS:
        raise ValueError(f"Unknown default drafter kind {kind!r}; choose one of {list(DEFAULT_DRAFTER_KINDS)}.")
    folder = Path(path) if path is not None else default_drafter_dir(variant)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"No trained default drafter at {folder}. Train one with `hf-dspark train` (see README) or pass a path."
        )
    drafter = DSparkDrafter.from_pretrained(folder, target=target)
    return drafter if kind == "dspark" else hybrid_for(drafter, "prompt-lookup")
