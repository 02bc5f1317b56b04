"""Checkpoint layouts in and out.

Read (`DSparkDrafter.from_pretrained(path, target=..., assume_layout=...)`): native hf-dspark folders, DSpark-format
folders (DeepSpec / serving engines `<Family>DSparkModel`, SpecForge `DSparkDraftModel`), z-lab DFlash folders
(`DFlashDraftModel`) and speculators DSpark folders; the block layout comes from any of its spellings.
Write: `export_drafter(drafter, out, engine="vllm"|"sglang"|"speculators"|"deepspec")` (the engine's own layout,
checked against its contract in `contracts.py`, with sidecars and a launch README) and `save_for_hub` /
`write_model_card` (native folder with remote-code entry point and model card). `probe_layout` measures which block
layout a drafter's weights were trained for.
"""

from .contract_checks import check_export
from .contracts import ENGINE_CONTRACTS, EngineContract, Refusal, get_contract, refusals, register_engine_contract
from .contracts_trtllm import TENSORRT_LLM  # registers the TensorRT-LLM contract
from .engines import readme
from .export import export_deepspec, export_drafter
from .hub import add_remote_code, save_for_hub, write_model_card
from .layout_flags import ASSUME_LAYOUTS
from .loading import LAYOUTS, detect_layout, load_drafter
from .probe import LayoutProbe, probe_layout

__all__ = [
    "ASSUME_LAYOUTS",
    "ENGINE_CONTRACTS",
    "LAYOUTS",
    "TENSORRT_LLM",
    "EngineContract",
    "LayoutProbe",
    "Refusal",
    "add_remote_code",
    "check_export",
    "detect_layout",
    "export_deepspec",
    "export_drafter",
    "get_contract",
    "load_drafter",
    "probe_layout",
    "readme",
    "refusals",
    "register_engine_contract",
    "save_for_hub",
    "write_model_card",
]
