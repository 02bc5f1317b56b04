"""The launch README written next to an engine export: γ as a launch requirement, the launch lines, what the engine
does instead of reading our sidecars, and the engine files the export was checked against (interop/contracts.py).
"""

from __future__ import annotations

from ..model.configuration_dspark import DSparkConfig
from ..model.heads import get_head
from .contracts import EngineContract, get_contract
from .layout_flags import layout_name


def _launch(config: DSparkConfig, contract: EngineContract, out_name: str, target: str) -> list[str]:
    gamma = config.block_size
    dflash = not config.sample_from_anchor
    if contract.name in ("vllm", "speculators"):
        method = "dflash" if dflash and contract.name == "vllm" else "dspark"
        return [
            "```bash",
            f"vllm serve {target} \\",
            f'  --speculative-config \'{{"method": "{method}", "model": "{out_name}", '
            f'"num_speculative_tokens": {gamma}, "draft_sample_method": "probabilistic"}}\'',
            "```",
            "",
            "`draft_sample_method: probabilistic` samples drafts from p_draft and uses it in rejection sampling "
            "(`greedy`, vLLM's default, treats drafts as one-hot).",
        ]
    if contract.name == "sglang":
        algorithm = "DFLASH" if dflash else "DSPARK"
        return [
            "```bash",
            f"SGLANG_ENABLE_SPEC_V2=1 python -m sglang.launch_server --model-path {target} \\",
            f"  --speculative-algorithm {algorithm} --speculative-draft-model-path {out_name} \\",
            f"  --speculative-num-draft-tokens {gamma} --speculative-eagle-topk 1",
            "```",
        ]
    if contract.name == "tensorrt_llm":
        return [
            "```bash",
            f"trtllm-serve {target} --extra_llm_api_options dspark.yaml",
            "```",
            "",
            f"with a DSpark `speculative_config` in `dspark.yaml` naming `{out_name}` as the draft model and "
            f"`max_draft_len: {gamma}`.",
        ]
    return [
        "```bash",
        f"python eval.py  # with the draft model path set to {out_name} and the target to {target}",
        "```",
        "",
        "DeepSpec's `eval.py` dispatches on `architectures[0]` (`Qwen3DSparkModel`).",
    ]


def _summary(config: DSparkConfig, contract: EngineContract, out_name: str, dtype: str) -> list[str]:
    vocab = (
        f"a {config.draft_vocab_size}-token draft vocabulary (pruned `lm_head [{config.draft_vocab_size}, "
        f"{config.hidden_size}]` plus `d2t`)"
        if config.draft_vocab_size
        else "the full vocabulary"
    )
    return [
        f"# DSpark drafter `{out_name}` for {contract.title}",
        "",
        f"Exported by hf-dspark as `{contract.architecture(config.sample_from_anchor)}` in {dtype}: γ = "
        f"{config.block_size} drafts per round, {layout_name(config.sample_from_anchor)} block "
        f"({config.num_block_slots} slots), taps {config.target_layer_ids} of a {config.num_target_layers}-layer "
        f"`{config.target_model_type}` target, {get_head(config.head_type).label} head"
        f"{'' if get_head(config.head_type).module is None else f' (rank {config.markov_rank})'}, confidence head: "
        f"{'yes' if config.use_confidence_head else 'no'}, mask_token_id = {config.mask_token_id}, drafting over "
        f"{vocab}.",
        "",
    ]


def _requirement(config: DSparkConfig, contract: EngineContract) -> list[str]:
    gamma = config.block_size
    return [
        f"## Requirement: num_speculative_tokens = γ = {gamma}",
        "",
        f"**Launch with exactly γ = {gamma} speculative tokens (`num_speculative_tokens = {gamma}`).** "
        f"{contract.title} takes γ from "
        f"{contract.gamma_from}. Any other value drafts from slots the weights were not trained for: acceptance "
        "collapses at every position and nothing reports an error.",
        "",
    ]


def readme(
    config: DSparkConfig,
    engine: str | EngineContract,
    out_name: str = "OUT",
    target: str = "TARGET",
    dtype: str = "bfloat16",
) -> str:
    """Markdown for an export folder: the γ requirement, launch lines, sidecars, minimum engine versions, notes and
    the sources read."""
    contract = get_contract(engine)
    lines = _summary(config, contract, out_name, dtype) + _requirement(config, contract)
    lines += [f"## Launch ({contract.title})", "", *_launch(config, contract, out_name, target), ""]
    if not config.sample_from_anchor and contract.config_format != "speculators":
        lines += [
            "This drafter uses the anchor + γ masks (1 + N) block, so it is written as a z-lab "
            "`DFlashDraftModel` (block_size = γ + 1) and served by the engine's DFlash method"
            + (", without its confidence head (the DFlash class has none)." if config.use_confidence_head else "."),
            "",
        ]
    lines += [
        "## Sidecars this engine ignores",
        "",
        "`calibration.json` (STS temperatures per decoding mode, c_k = σ(z_k / T_k), and the held-out acceptance) "
        "and `step_curve.json` (SPS(B) of the target where it was profiled) are what hf-dspark's own scheduler "
        f"reads. {contract.sidecars}",
        "",
    ]
    lines += ["## Minimum versions", ""]
    if contract.min_versions:
        lines += [*[f"- {version}" for version in contract.min_versions], ""]
    else:
        lines += [f"Checked against the {contract.title} commits below; older versions are untested.", ""]
    if contract.notes:
        lines += ["## Notes", "", *[f"- {note}" for note in contract.notes], ""]
    lines += ["## Checked against", "", *[f"- {source}" for source in contract.sources], ""]
    return "\n".join(lines)


__all__ = ["readme"]
