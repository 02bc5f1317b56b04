"""What serving engines accept, and the launch snippet written next to an exported drafter.

Sources read (July-October 2026 snapshots; flags change quickly, re-check against the version you deploy):

- vLLM, `main` branch: `vllm/config/speculative.py` (commit 002e77c1: `method="dspark"`, `num_speculative_tokens`,
  `draft_sample_method` greedy|probabilistic, `enable_adaptive_verification` "currently only supported for
  method='dspark'"), `vllm/model_executor/models/qwen3_dspark.py` (commit 0302ff40: `Qwen3DSparkModel` = DFlash
  Qwen3 backbone + vanilla Markov head `markov_w1`/`markov_w2` + confidence head; `embed_tokens`/`lm_head` optional,
  shared from the target; `mask_embedding` ignored) and `vllm/v1/spec_decode/dspark.py` (commit 26a86f53: anchor-first
  block of `num_speculative_tokens` slots, fixed-width verification). Registry names seen: `Qwen3DSparkModel`,
  `DSparkDraftModel` (DeepSeek-V4), `K3DSparkModel`.
- SGLang: `--speculative-algorithm DSPARK`, `--speculative-draft-model-path`, `--speculative-dspark-block-size`,
  from the v0.5.16 release notes and several public launch scripts; sglang's `server_args.py` itself was not read.
- TensorRT-LLM: `tensorrt_llm.llmapi.DSparkDecodingConfig` reference pages for 1.3.0rc27, 1.4.0rc1 and 1.4.0rc4
  (`max_draft_len`, `speculative_model`, `mask_token_id`, `target_layer_ids`, `block_size`, `markov_rank`,
  `markov_head_type` in vanilla|gated|rnn; 1.4.0rc4 adds `enable_confidence_scheduling`,
  `confidence_cost_table_path`, `confidence_calibration_path`, whose file formats those pages do not give).
"""

from __future__ import annotations

from ..configuration_dspark import DSparkConfig
from .deepspec import family_architecture

VLLM_ARCHITECTURES = ("Qwen3DSparkModel", "DSparkDraftModel", "K3DSparkModel")


def engine_warnings(config: DSparkConfig) -> list[str]:
    """One line per setting a serving engine is known (or likely) not to serve as this drafter computes it."""
    warnings = []
    arch = family_architecture(config.target_model_type)
    if config.head_type == "rnn":
        warnings.append(
            "vLLM: the RNN sequential head is not supported (Qwen3DSparkModel loads only the vanilla Markov head "
            "markov_w1/markov_w2, no joint_proj); TensorRT-LLM's DSparkDecodingConfig lists markov_head_type 'rnn'."
        )
    if config.head_type == "none":
        warnings.append(
            "vLLM/SGLang/TensorRT-LLM: this drafter has no Markov head (a DFlash-style parallel drafter); the "
            "engines' DSpark paths build a Markov head from markov_rank, which is 0 here. Serve it with the "
            "engine's DFlash method instead (not checked by this exporter)."
        )
    if config.mask_token_id is None:
        warnings.append(
            "all engines: the drafter learned its own mask embedding (mask_token_id is None); engines fill mask "
            "slots with a vocabulary row (vLLM drops mask_embedding, TensorRT-LLM takes a mask_token_id), so they "
            "cannot serve it as trained. Retrain with a spare token as mask_token_id."
        )
    if not config.sample_from_anchor:
        warnings.append(
            "vLLM: the dspark proposer builds anchor-first blocks; this drafter uses the DFlash convention "
            "(sample_from_anchor=false, γ + 1 slots) and would be mis-served there. SGLang/TensorRT-LLM: not checked."
        )
    if arch not in VLLM_ARCHITECTURES:
        relabel = "" if config.use_qk_norm else (
            "; its layers lack the q/k RMSNorms of Qwen3 layers, so relabelling it Qwen3DSparkModel changes "
            "its outputs"
        )
        warnings.append(
            f"vLLM: no {arch} in the model registry (it has {', '.join(VLLM_ARCHITECTURES)}){relabel}; serving it "
            "needs an engine that implements this family's DSpark draft layers."
        )
    return warnings


def _header(config: DSparkConfig, out_name: str, warnings: list[str]) -> list[str]:
    head = {"markov": "vanilla Markov", "rnn": "RNN", "none": "none"}[config.head_type]
    lines = [
        f"# DSpark drafter `{out_name}` (DeepSpec / serving-engine layout)",
        "",
        f"Exported by hf-dspark. γ = {config.block_size} drafts per round; `block_size` in config.json = "
        f"{config.num_block_slots}; `sample_from_anchor` = {str(config.sample_from_anchor).lower()}; taps "
        f"{config.target_layer_ids} of a {config.num_target_layers}-layer `{config.target_model_type}` target; "
        f"sequential head: {head} (rank {config.markov_rank if config.head_type != 'none' else 0}); confidence head: "
        f"{'yes' if config.use_confidence_head else 'no'}; mask_token_id = {config.mask_token_id}.",
        "",
        "Files: `config.json`, `model.safetensors` (with copies of the target's `embed_tokens.weight` and "
        "`lm_head.weight`), `calibration.json` (STS temperatures: `sampling`, `greedy`; c_k = σ(z_k / T_k)) and, "
        "when profiled, `step_curve.json` (SPS(B) of the target on the machine that profiled it; re-profile on the "
        "serving GPU, a CPU curve does not transfer).",
        "",
    ]
    if warnings:
        lines += ["## Warnings", ""] + [f"- WARNING {w}" for w in warnings] + [""]
    return lines


def readme_snippet(config: DSparkConfig, out_name: str = "OUT", target: str = "TARGET") -> str:
    """Markdown with vLLM, SGLang and TensorRT-LLM launch settings for an exported folder, warnings first."""
    gamma = config.block_size
    lines = _header(config, out_name, engine_warnings(config))
    lines += [
        "## vLLM",
        "",
        "Checked against vLLM `main` (mid 2026: `vllm/config/speculative.py`, `model_executor/models/"
        "qwen3_dspark.py`); third-party notes report `method: dspark` from vLLM 0.26.0 on.",
        "",
        "```bash",
        f"vllm serve {target} \\",
        f"  --speculative-config '{{\"method\": \"dspark\", \"model\": \"{out_name}\", "
        f"\"num_speculative_tokens\": {gamma}, \"draft_sample_method\": \"probabilistic\"}}'",
        "```",
        "",
        "`draft_sample_method: probabilistic` samples drafts from p_draft and uses it in rejection sampling "
        "(`greedy`, the default, treats drafts as one-hot). `\"enable_adaptive_verification\": true` sizes the verify "
        "budget from the confidences (dspark only); whether vLLM reads `calibration.json` / `step_curve.json` was not "
        "found in the code read.",
        "",
        "## SGLang",
        "",
        "From the SGLang v0.5.16 release notes and public launch scripts (sglang's `server_args.py` not read):",
        "",
        "```bash",
        f"python -m sglang.launch_server --model-path {target} \\",
        f"  --speculative-algorithm DSPARK --speculative-draft-model-path {out_name} \\",
        f"  --speculative-dspark-block-size {gamma}",
        "```",
        "",
        "A `--speculative-dspark-confidence-sts-path` flag for STS temperatures appears in one third-party script "
        "only; its expected file format is unknown here, so it is not used above.",
        "",
        "## TensorRT-LLM",
        "",
        "From the `DSparkDecodingConfig` reference (TensorRT-LLM 1.3.0rc27 - 1.4.0rc4), LLM API:",
        "",
        "```python",
        "from tensorrt_llm import LLM",
        "from tensorrt_llm.llmapi import DSparkDecodingConfig",
        "",
        f'spec = DSparkDecodingConfig(max_draft_len={gamma}, speculative_model="{out_name}")',
        f'llm = LLM(model="{target}", speculative_config=spec)',
        "```",
        "",
        "1.4.0rc4 also has `enable_confidence_scheduling`, `confidence_cost_table_path` and "
        "`confidence_calibration_path`; their file formats are not documented on those pages, so it is not known "
        "whether they accept `step_curve.json` / `calibration.json` as written here.",
        "",
    ]
    return "\n".join(lines)
