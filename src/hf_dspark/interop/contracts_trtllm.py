"""TensorRT-LLM's contract (`hf-dspark export --engine tensorrt-llm`), written from its Qwen3 DSpark drafter class.

TensorRT-LLM serves DSpark two ways: DeepSeek-V4 drafters whose weights live inside the target checkpoint (MLA +
MoE + mHC stages, `main_proj` / `main_norm`), which no hf-dspark drafter can become, and separate dense Qwen3
drafters in DeepSpec's flat layout (`Qwen3DSparkModel`), which this contract covers. Its loader takes the draft
tensors strictly (every parameter present, no extra names), skips `embed_tokens` / `lm_head` for the target's, reads
no layout flag (the block is [anchor, mask × (γ − 1)], anchor-first), sorts the capture layers, and raises unless
the config's `block_size` equals the launch's `max_draft_len`.
"""

from __future__ import annotations

from .contracts import ContractSource, EngineContract, register_engine_contract

TENSORRT_LLM = register_engine_contract(
    EngineContract(
        name="tensorrt_llm",
        title="TensorRT-LLM",
        sources=(
            ContractSource(
                "NVIDIA/TensorRT-LLM",
                "tensorrt_llm/_torch/models/modeling_dspark_qwen3.py",
                "40289c86",
                "Qwen3DSparkDraftModel: flat fc / hidden_norm / layers.* / norm / markov_head.* / "
                "confidence_head.proj (with bias) loaded strictly, embed_tokens and lm_head skipped for the "
                "target's (no draft vocabulary, no d2t); q/k RMSNorms, SiLU MLP, no attention bias, plain "
                "RoPE; mask_token_id from the config; confidence_head_with_markov defaults to false; "
                "the block is [bonus, mask x (block_size - 1)]",
            ),
            ContractSource(
                "NVIDIA/TensorRT-LLM",
                "tensorrt_llm/_torch/speculative/dspark.py",
                "005c932d",
                "DSparkWorker: block_size must equal max_draft_len (ValueError otherwise); capture layers "
                "sorted; the confidence gate is not applied (the full block is proposed)",
            ),
            ContractSource(
                "NVIDIA/TensorRT-LLM",
                "tensorrt_llm/_torch/models/dspark/heads.py",
                "06ec703b",
                "markov_head_type vanilla | gated | rnn over the full vocabulary (markov_w2 [V, r]); "
                "markov_rank 0 builds no head",
            ),
        ),
        required_keys=(
            "target_layer_ids",
            "block_size",
            "mask_token_id",
            "markov_rank",
            "enable_confidence_head",
            "confidence_head_with_markov",
            "head_dim",
        ),
        forbidden_keys=("draft_vocab_size",),
        head_types=("markov", "rnn", "none"),
        embedding_tap=False,  # how a tap of -1 maps onto its capture layers was not verified
        increasing_taps=True,  # it sorts the capture layers, so fc's input blocks must already be in that order
        plain_layers=True,
        gamma_from="the config's block_size, which must equal the launch's `max_draft_len` (TensorRT-LLM raises "
        "otherwise)",
        sidecars=(
            "TensorRT-LLM reads neither file: it proposes the full block of γ drafts (its confidence head is "
            "loaded but not used to truncate) and has no cost model."
        ),
        notes=(
            "TensorRT-LLM's DeepSeek-V4 DSpark path (drafter weights inside the target checkpoint, MLA + MoE + mHC "
            "stages) is a different format and is not written.",
        ),
    )
)

__all__ = ["TENSORRT_LLM"]
