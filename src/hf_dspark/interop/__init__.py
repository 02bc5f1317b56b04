"""Checkpoint layouts in and out.

Read (`DSparkDrafter.from_pretrained(path, target=...)`): native hf-dspark folders, the DeepSpec / serving-engine
layout (`<Family>DSparkModel`) and z-lab DFlash folders (`DFlashDraftModel`, kept in the DFlash block convention).
Write: `export_deepspec` (engine layout + calibration.json / step_curve.json sidecars + launch notes) and
`save_for_hub` / `write_model_card` (native folder with remote-code entry point and model card).
"""

from .engines import engine_warnings, readme_snippet
from .export import export_deepspec
from .hub import add_remote_code, save_for_hub, write_model_card
from .loading import LAYOUTS, detect_layout, load_drafter

__all__ = [
    "LAYOUTS",
    "add_remote_code",
    "detect_layout",
    "engine_warnings",
    "export_deepspec",
    "load_drafter",
    "readme_snippet",
    "save_for_hub",
    "write_model_card",
]
