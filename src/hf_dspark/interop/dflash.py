"""z-lab DFlash checkpoints in (github.com/z-lab/dflash, `DFlashDraftModel`).

Layout: `config.json` is the target's config (its `model_type`, shape fields) with the drafter's
`num_hidden_layers`, `num_target_layers`, a top-level `block_size` (a `dflash_config.block_size` takes
precedence, as in z-lab's loader) and `dflash_config = {"target_layer_ids": [...], "mask_token_id": ...}`; the
weights are `fc`, `hidden_norm`, `norm` and `layers.{i}.*` with q/k norms (the same names as here), and no own
embedding, LM head, Markov or confidence head.

Block convention (z-lab `dflash_generate` / `spec_generate`): the block is [anchor, mask × (block_size − 1)] at
positions anchor_pos .. anchor_pos + block_size − 1; the draft for position anchor_pos + k is the LM head on the
output of slot k (`[:, 1 - block_size:]`), so slot 0 drafts nothing and a round proposes γ = block_size − 1 tokens.
Context features are the outputs of decoder layers `target_layer_ids` (`hidden_states[i + 1]`), projected by
`hidden_norm(fc(.))`, and every draft layer attends bidirectionally to [context ‖ block]. The loaded drafter keeps
that convention (`sample_from_anchor=False`, `block_size` = γ): its weights are not reinterpreted as anchor-first.

Newer DFlash checkpoints trained anchor-first (DeepSpec's DFlash-1, DFlash2 exports) say so with a layout flag
(`dflash_config.query_zero_predicts_next: true`, `sample_from_anchor: true`, ...; interop/layout_flags.py); their
`block_size` then counts γ slots that all draft. Conflicting flags are refused unless `assume_layout` decides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..model.configuration_dspark import DSparkConfig
from .layout_flags import resolve_layout
from .layouts import check_full_attention, nested, read_calibration, shape_fields

DFLASH_ARCHITECTURE = "DFlashDraftModel"
UNSUPPORTED_ARCHITECTURES = {
    "DFlash2DraftModel": "DFlash2 adds grouped dynamic convolutions and a candidate selector",
}
Z_LAB_DEFAULT_BLOCK_SIZE = 16  # z-lab's loader default when the config names none


def is_dflash(raw: dict[str, Any]) -> bool:
    """Whether a config.json dict describes a z-lab DFlash drafter."""
    return DFLASH_ARCHITECTURE in (raw.get("architectures") or []) or isinstance(raw.get("dflash_config"), dict)


def _refuse_unsupported(raw: dict[str, Any], config_file: Path) -> None:
    for arch in raw.get("architectures") or []:
        if arch in UNSUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"{config_file} describes a {arch} ({UNSUPPORTED_ARCHITECTURES[arch]}); hf-dspark reads "
                f"{DFLASH_ARCHITECTURE} checkpoints only."
            )
    multiplier = nested(raw, "output_multiplier", 1.0)
    softcap = nested(raw, "final_logit_softcapping")
    if float(multiplier) != 1.0 or (softcap is not None and float(softcap) > 0):
        raise ValueError(
            f"{config_file} scales or soft-caps the draft logits (output_multiplier={multiplier}, "
            f"final_logit_softcapping={softcap}); hf-dspark drafts with the target's plain LM head."
        )


def config_from_dflash(raw: dict[str, Any], config_file: Path, use_qk_norm: bool,
                       assume_layout: str | None = None) -> DSparkConfig:
    """A `DSparkConfig` from a z-lab DFlash `config.json` dict (anchor + γ masks unless a layout flag says
    anchor-first)."""
    _refuse_unsupported(raw, config_file)
    check_full_attention(raw, config_file)
    layer_ids = nested(raw, "target_layer_ids")
    mask_token_id = nested(raw, "mask_token_id")
    if layer_ids is None or mask_token_id is None:
        raise ValueError(
            f"{config_file} lacks dflash_config.target_layer_ids or dflash_config.mask_token_id "
            f"(found {raw.get('dflash_config')!r}); both are needed to run a DFlash drafter."
        )
    sample_from_anchor = resolve_layout(raw, config_file, False, "z-lab DFlash", assume_layout)
    slots = int(nested(raw, "block_size", Z_LAB_DEFAULT_BLOCK_SIZE))
    gamma = slots if sample_from_anchor else slots - 1
    if gamma < 1:
        raise ValueError(f"{config_file}: DFlash block_size {slots} leaves no draft slot (needs >= 2).")
    fields = shape_fields(raw, config_file, use_qk_norm)
    fields["embedding_multiplier"] = float(nested(raw, "input_embedding_scale", 1.0))  # z-lab: raw rows × scale
    return DSparkConfig(
        block_size=gamma,
        target_layer_ids=[int(i) for i in layer_ids],
        mask_token_id=int(mask_token_id),
        head_type="none",
        use_confidence_head=False,
        confidence_with_markov=False,
        sample_from_anchor=sample_from_anchor,
        source_layout="dflash",
        **read_calibration(config_file.parent, gamma),
        **fields,
    )
