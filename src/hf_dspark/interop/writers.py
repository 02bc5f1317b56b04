"""The config.json and tensors of an engine export, one builder per config format (docs/checkpoints.md).

- DSpark format (`--engine vllm|sglang|deepspec`, anchor-first): a copy of the target's config (its `model_type` and
  shape fields, the drafter's `num_hidden_layers`) with the flat DSpark fields, the layout flag in every spelling
  (top level and in `dflash_config`, with `target_layer_ids` and `mask_token_id` there too), and the drafter's
  tensors plus `lm_head` (pruned to the draft vocabulary, `[V_draft, d]`, with `d2t`, when there is one) and
  `embed_tokens` copies of the target's.
- DFlash architecture (anchor + γ masks drafters without a sequential head, `--engine vllm|sglang`): the z-lab
  `DFlashDraftModel` layout, `block_size` = γ + 1, backbone tensors only.
- speculators format (`--engine speculators`): `DSparkSpeculatorConfig` (`transformer_layer_config`, hidden-state
  indices in `aux_hidden_state_layer_ids`, `speculators_config`), tensors with `lm_head [V_draft, d]`, `d2t`, `t2d`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..model.configuration_dspark import DSparkConfig
from ..model.heads import get_head
from ..version import __version__
from .contracts import SPECULATORS, EngineContract
from .layout_flags import NESTED, layout_fields

DEEPSPEC_NUM_ANCHORS = 512  # training-only field DeepSpec's model classes require (its configs use 512)
DFLASH_ARCHITECTURE = "DFlashDraftModel"
VOCAB_BUFFERS = ("d2t", "t2d")
# Draft-layer fields a speculators / vLLM loader reads without a default in some version: no sliding window,
# bidirectional blocks (hf-dspark's draft layers are full attention).
SPECULATORS_LAYER_DEFAULTS = {"sliding_window": None, "use_sliding_window": False, "is_causal": False}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def layer_fields(config: DSparkConfig) -> dict[str, Any]:
    """The target-shape fields of the drafter's layers (a copy of the target's, `num_hidden_layers` the drafter's)."""
    rope = dict(config.rope_parameters)
    return {
        "model_type": config.target_model_type or "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": rope,
        "rope_theta": rope.get("rope_theta"),
        "max_position_embeddings": config.max_position_embeddings,
        "attention_bias": config.attention_bias,
        "attention_dropout": 0.0,
        "vocab_size": config.vocab_size,
        "num_hidden_layers": config.num_hidden_layers,
        "layer_types": ["full_attention"] * config.num_hidden_layers,
        "tie_word_embeddings": False,
    }


def _sidecar_fields(config: DSparkConfig) -> dict[str, Any]:
    return {
        "calibration_temperatures": list(config.calibration_temperatures),
        "calibration_temperatures_greedy": list(config.temperatures_for(greedy=True)),
        "hf_dspark_version": __version__,
    }


def dspark_config(config: DSparkConfig, contract: EngineContract, dtype: torch.dtype) -> dict[str, Any]:
    """The DSpark-format config.json of an anchor-first drafter for `contract`'s engine."""
    flags = {k: v for k, v in layout_fields(config.sample_from_anchor).items() if k in contract.layout_keys}
    head = get_head(config.head_type)
    raw: dict[str, Any] = {
        "architectures": [contract.architecture(config.sample_from_anchor)],
        **layer_fields(config),
        "dtype": dtype_name(dtype),
        "num_target_layers": config.num_target_layers,
        "target_layer_ids": list(config.target_layer_ids),
        "block_size": config.num_block_slots,
        "mask_token_id": config.mask_token_id,
        **flags,
        "markov_rank": 0 if head.export_name is None else config.markov_rank,
        "enable_confidence_head": config.use_confidence_head,
        "confidence_head_with_markov": config.use_confidence_head and config.confidence_with_markov,
        "num_anchors": DEEPSPEC_NUM_ANCHORS,
    }
    if head.export_name is not None:
        raw["markov_head_type"] = head.export_name
    if contract.draft_vocab:
        raw["draft_vocab_size"] = config.num_draft_tokens
    if contract.nested_layout_keys:
        raw[NESTED] = {"target_layer_ids": list(config.target_layer_ids), "mask_token_id": config.mask_token_id,
                       **flags, **_causality(contract)}
    return raw | _sidecar_fields(config)


def _causality(contract: EngineContract) -> dict[str, Any]:
    """`dflash_config.causal: false` where the engine reads it: hf-dspark blocks attend bidirectionally."""
    return {"causal": False} if contract.reads_causality else {}


def dflash_config(config: DSparkConfig, contract: EngineContract, dtype: torch.dtype) -> dict[str, Any]:
    """The z-lab DFlash config.json of an anchor + γ masks drafter without a sequential head."""
    flags = {k: v for k, v in layout_fields(config.sample_from_anchor).items() if k in contract.layout_keys}
    return {
        "architectures": [DFLASH_ARCHITECTURE],
        **layer_fields(config),
        "dtype": dtype_name(dtype),
        "num_target_layers": config.num_target_layers,
        "block_size": config.num_block_slots,
        **flags,
        NESTED: {"target_layer_ids": list(config.target_layer_ids), "mask_token_id": config.mask_token_id, **flags,
                 **_causality(contract)},
    } | _sidecar_fields(config)


def speculators_config(
    config: DSparkConfig, dtype: torch.dtype, verifier_name: str, verifier_architectures: list[str]
) -> dict[str, Any]:
    """`DSparkSpeculatorConfig` as JSON: γ = block_size anchor-first, block_size − 1 with the 1 + N block.

    `transformer_layer_config` spells out every field a speculators or vLLM loader reads from it, defaults or not:
    speculators' DFlash core reads `sliding_window` and `layer_types` as attributes (a `LlamaConfig` has no
    `sliding_window` of its own), and vLLM copies the dict into the draft's config, where `is_causal` decides the
    block attention and a missing `rope_theta` defaults to 1e6."""
    layers = layer_fields(config) | {
        "dtype": dtype_name(dtype),
        "num_target_layers": config.num_target_layers,
        **SPECULATORS_LAYER_DEFAULTS,
    }
    head = get_head(config.head_type)
    return {
        "speculators_model_type": "dspark",
        "architectures": ["DSparkSpeculator"],
        "transformer_layer_config": layers,
        "draft_vocab_size": config.num_draft_tokens,
        "block_size": config.num_block_slots,
        "aux_hidden_state_layer_ids": [i + 1 for i in config.target_layer_ids],  # hidden_states indices
        "mask_token_id": config.mask_token_id,
        "target_hidden_size": None,  # the target's hidden size is the drafter's
        "sliding_window_non_causal": False,
        "sample_from_anchor": config.sample_from_anchor,
        "markov_rank": 0 if head.export_name is None else config.markov_rank,
        "markov_head_type": head.export_name or "vanilla",  # a type is required; read only with markov_rank > 0
        "enable_confidence_head": config.use_confidence_head,
        "confidence_head_with_markov": config.use_confidence_head and config.confidence_with_markov,
        "speculators_config": {
            "algorithm": "dspark",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": config.block_size,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],  # exact verification
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name, "architectures": list(verifier_architectures)},
        },
        "tie_word_embeddings": False,  # speculators forces it; the LM head rows are the target's
        "dtype": dtype_name(dtype),
    } | _sidecar_fields(config)


def engine_config(config: DSparkConfig, contract: EngineContract, dtype: torch.dtype, verifier_name: str = "TARGET",
                  verifier_architectures: list[str] | None = None) -> dict[str, Any]:
    """config.json of `contract`'s export (the drafter must pass `refusals` for that engine)."""
    if contract.config_format == SPECULATORS:
        return speculators_config(config, dtype, verifier_name, verifier_architectures or [])
    if contract.architecture(config.sample_from_anchor) == DFLASH_ARCHITECTURE:
        return dflash_config(config, contract, dtype)
    return dspark_config(config, contract, dtype)


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    tensor = tensor.detach().to("cpu")
    return (tensor.to(dtype) if tensor.is_floating_point() else tensor).clone().contiguous()


def engine_tensors(drafter, contract: EngineContract, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors of `contract`'s export, floating point ones in `dtype` (no `model.` prefix).

    `lm_head.weight` holds the target's LM-head rows of the draft vocabulary (`[V_draft, d]`) or all of them;
    `embed_tokens.weight` a copy of the target's embedding where the engine takes one."""
    bound = drafter._require_bound()
    config = drafter.config
    state = {name: _cast(t, dtype) for name, t in drafter.state_dict().items()}
    if contract.config_format != SPECULATORS and contract.architecture(config.sample_from_anchor) == (
        DFLASH_ARCHITECTURE
    ):
        keep = ("fc.", "hidden_norm.", "norm.", "layers.")
        return {name: t for name, t in state.items() if name.startswith(keep)}
    keep_vocab = {"d2t", "t2d"} if contract.writes_t2d else {"d2t"}
    if not contract.draft_vocab:
        keep_vocab = set()
    tensors = {name: t for name, t in state.items() if name not in VOCAB_BUFFERS or name in keep_vocab}
    lm_head = bound.lm_head.weight.detach()
    ids = drafter.draft_token_ids()
    if ids is not None:
        lm_head = lm_head[ids.to(lm_head.device)]
    tensors["lm_head.weight"] = _cast(lm_head, dtype)  # a copy: tied targets share one tensor with the embedding
    if contract.embed_tokens != "absent":
        tensors["embed_tokens.weight"] = _cast(bound.embed_tokens.weight, dtype)
    return tensors


__all__ = ["DFLASH_ARCHITECTURE", "engine_config", "engine_tensors", "layer_fields"]
