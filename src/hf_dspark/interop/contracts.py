"""What each serving / training engine loads, as data: one `EngineContract` per engine, written from the engines' own
loader code (the files and commits are in each contract's `sources` and in docs/checkpoints.md).

A contract answers two questions:

- `refusals(config, engine)`: can this drafter be served by that engine as it computes? Every "no" names the engine,
  the reason and the fix; `export_drafter` refuses to write such an export.
- `check_export(folder, engine)`: does a written folder satisfy the engine's loader (architecture, required and
  forbidden config keys, the layout flag in every spelling, tensor names, shapes and dtypes)? The tests run it on
  every head / layout / draft-vocabulary combination.

New engines are added with `register_engine_contract` (modelled on PEFT's `register_peft_method`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.configuration_dspark import EMBEDDING_TAP, DSparkConfig
from ..model.heads import get_head

DSPARK, SPECULATORS = "dspark", "speculators"  # config formats: flat DSpark fields / speculators' nested format


@dataclass(frozen=True)
class ContractSource:
    """One engine file read to write a contract.

    Args:
        repo: GitHub `owner/name`.
        path: file inside the repository.
        commit: the commit read (abbreviated).
        rules: what that file fixes, in a few words.
    """

    repo: str
    path: str
    commit: str
    rules: str

    def __str__(self) -> str:
        return f"{self.repo} {self.path} @ {self.commit} ({self.rules})"


@dataclass(frozen=True)
class EngineContract:
    """The loading rules of one engine.

    Args:
        name: the engine's id (`hf-dspark export --engine NAME`).
        title: its display name.
        sources: the engine files these rules come from.
        config_format: `"dspark"` (flat DSpark fields over a copy of the target's config) or `"speculators"`.
        anchor_first_architecture: `architectures[0]` for an anchor-first drafter (`None`: not served).
        dflash_architecture: `architectures[0]` for an anchor + γ masks drafter without a sequential head (`None`:
            not served). 1 + N drafters are never written under a `*DSparkModel` name.
        layout_keys: layout spellings written (top-level, and in `dflash_config` when `nested_layout_keys`).
        nested_layout_keys: whether `dflash_config` carries the layout spellings too.
        required_keys: config keys the loader reads without a default (dotted for nested keys).
        forbidden_keys: config keys that must not appear (the loader would misread them).
        head_types: hf-dspark head types it serves.
        draft_vocab: whether it serves a draft vocabulary (a pruned `lm_head [V_draft, d]` plus `d2t`).
        writes_t2d: whether the `t2d` mask is written (engines that reject unknown tensors refuse it).
        embed_tokens: `"required"`, `"optional"` (written, may be replaced by the target's) or `"absent"`.
        confidence_needs_markov: the confidence head must read the Markov embedding.
        needs_qk_norm: the engine's draft layers always apply per-head q/k RMSNorms.
        needs_mask_token_id: mask slots must be a vocabulary row (no learned mask embedding).
        embedding_tap: whether target layer id -1 (the embedding output) is read as such.
        reads_causality: the engine decides per draft layer whether block attention is causal (`is_causal`, then
            `dflash_config.causal`, then `layer_types[i] == "sliding_attention"`); the export says `causal: false`.
        increasing_taps: the engine requires strictly increasing target_layer_ids.
        plain_layers: the engine's draft layers are fixed Qwen3 layers (SiLU MLP, no attention bias, default RoPE).
        gamma_from: where the engine takes γ from (what the launch must set).
        sidecars: what the engine does instead of reading calibration.json / step_curve.json.
        notes: further facts the launch README states.
        min_versions: the oldest engine versions that serve the export as exported, each with why (the launch
            README states them; empty: only the commits in `sources` were checked).
    """

    name: str
    title: str
    sources: tuple[ContractSource, ...]
    config_format: str = DSPARK
    anchor_first_architecture: str | None = "Qwen3DSparkModel"
    dflash_architecture: str | None = None
    layout_keys: tuple[str, ...] = ("sample_from_anchor", "dspark_bonus_anchor", "query_zero_predicts_next",
                                    "shift_label")
    nested_layout_keys: bool = True
    required_keys: tuple[str, ...] = ()
    forbidden_keys: tuple[str, ...] = ()
    head_types: tuple[str, ...] = ("markov", "none")
    draft_vocab: bool = False
    writes_t2d: bool = False
    embed_tokens: str = "optional"
    confidence_needs_markov: bool = False
    needs_qk_norm: bool = True
    needs_mask_token_id: bool = True
    embedding_tap: bool = True
    reads_causality: bool = False
    increasing_taps: bool = False
    plain_layers: bool = False
    gamma_from: str = ""
    sidecars: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    min_versions: tuple[str, ...] = field(default_factory=tuple)

    def architecture(self, sample_from_anchor: bool) -> str | None:
        """`architectures[0]` this engine loads a drafter of that block layout under (None: not served)."""
        return self.anchor_first_architecture if sample_from_anchor else self.dflash_architecture


@dataclass(frozen=True)
class Refusal:
    """Why an engine cannot serve a drafter as it computes, and what to do instead."""

    engine: str
    reason: str
    fix: str

    def __str__(self) -> str:
        return f"{self.engine}: {self.reason} Fix: {self.fix}"


ENGINE_CONTRACTS: dict[str, EngineContract] = {}


def register_engine_contract(contract: EngineContract) -> EngineContract:
    """Add (or replace) an engine's contract; `hf-dspark export --engine` offers every registered name."""
    if not contract.name or not contract.name.isidentifier():
        raise ValueError(f"an engine contract needs an identifier-like name, got {contract.name!r}.")
    ENGINE_CONTRACTS[contract.name] = contract
    return contract


def get_contract(engine: str | EngineContract) -> EngineContract:
    """The registered contract of `engine`; ValueError naming the known engines otherwise."""
    if isinstance(engine, EngineContract):
        return engine
    engine = engine.replace("-", "_")  # `tensorrt-llm` is the `tensorrt_llm` contract
    if engine not in ENGINE_CONTRACTS:
        raise ValueError(f"unknown engine {engine!r}; choose one of {sorted(ENGINE_CONTRACTS)}.")
    return ENGINE_CONTRACTS[engine]


def refusals(config: DSparkConfig, engine: str | EngineContract) -> list[Refusal]:
    """Every reason `engine` cannot serve a drafter with this config as the drafter computes (empty: servable)."""
    contract = get_contract(engine)
    found = [check(config, contract) for check in _CHECKS]
    return [Refusal(contract.title, reason, fix) for reason, fix in (f for f in found if f is not None)]


def _layout(config: DSparkConfig, contract: EngineContract):
    if contract.architecture(config.sample_from_anchor) is not None:
        return None
    if config.sample_from_anchor:
        return ("it has no class for anchor-first drafters.", "export for another engine.")
    if get_head(config.head_type).module is not None:
        return (
            f"this drafter uses the anchor + γ masks (1 + N) block and has a {get_head(config.head_type).label} head; "
            f"{contract.title}'s DSpark classes run anchor-first blocks only"
            + (", and its DFlash class has no sequential head." if contract.dflash_architecture else "."),
            "export with --engine speculators (its DSpark format records sample_from_anchor=false), or retrain "
            "the drafter anchor-first with hf-dspark.",
        )
    return ("it serves anchor + γ masks (1 + N) drafters under no architecture.",
            "export with --engine vllm or --engine sglang (DFlash architecture) or --engine speculators.")


def _head(config: DSparkConfig, contract: EngineContract):
    if config.head_type in contract.head_types:
        return None
    return (f"the {get_head(config.head_type).label} head is not implemented there (it loads "
            f"{', '.join(get_head(h).label for h in contract.head_types)} only).",
            "retrain with head_type='markov', or export for an engine that implements it "
            f"({', '.join(sorted(c.name for c in ENGINE_CONTRACTS.values() if config.head_type in c.head_types))}).")


def _draft_vocab(config: DSparkConfig, contract: EngineContract):
    if config.draft_vocab_size is None:
        return None
    if contract.draft_vocab and contract.architecture(config.sample_from_anchor) == "DFlashDraftModel":
        return ("a draft vocabulary under its DFlash architecture (the route of anchor + γ masks drafters) was not "
                "verified against its loader.",
                "export with --engine speculators, or retrain with the full vocabulary (--draft_vocab_size 0).")
    if contract.draft_vocab:
        return None
    takers = sorted(c.name for c in ENGINE_CONTRACTS.values() if c.draft_vocab)
    return (f"the drafter drafts over a {config.draft_vocab_size}-token draft vocabulary, and {contract.title} "
            f"has no draft vocabulary (its Markov W2 and LM head are [V, r] / [V, d] over all {config.vocab_size} "
            "tokens, and it has no d2t mapping).",
            f"export with --engine {' or --engine '.join(takers)}, or retrain with the full vocabulary "
            "(--draft_vocab_size 0).")


def _confidence(config: DSparkConfig, contract: EngineContract):
    if not (contract.confidence_needs_markov and config.use_confidence_head and not config.confidence_with_markov):
        return None
    if not config.sample_from_anchor:
        return None  # written under the DFlash architecture, which carries no confidence head
    return ("its confidence head always reads [h_k; W1[x_{k-1}]], and this drafter's reads h_k only "
            "(confidence_with_markov=False).",
            "retrain with a Markov head and confidence_with_markov=True, or export with --engine vllm.")


def _qk_norm(config: DSparkConfig, contract: EngineContract):
    if config.use_qk_norm or not contract.needs_qk_norm:
        return None
    return (f"its draft layers always apply per-head q/k RMSNorms (Qwen3 layers), and this drafter's "
            f"{config.target_model_type or 'target-family'} layers have none; the engine would run them with "
            "untrained norms and draft something else, without an error.",
            "retrain with use_qk_norm=True (`hf-dspark train --use_qk_norm true`): the drafter layers are trained "
            "from scratch and only need the target's hidden size, heads and head_dim.")


def _mask(config: DSparkConfig, contract: EngineContract):
    if config.mask_token_id is not None or not contract.needs_mask_token_id:
        return None
    return ("the drafter learned its own mask embedding (mask_token_id is None); the engine fills mask slots with "
            "a vocabulary row (mask_token_id) and drops mask_embedding.",
            "retrain with a spare vocabulary token as mask_token_id.")


def _taps(config: DSparkConfig, contract: EngineContract):
    if contract.embedding_tap or EMBEDDING_TAP not in config.target_layer_ids:
        return None
    return ("the drafter taps the embedding output (target layer id -1), which this engine's config has no "
            "verified spelling for.", "export with --engine vllm, speculators or deepspec.")


def _taps_order(config: DSparkConfig, contract: EngineContract):
    if not contract.increasing_taps or list(config.target_layer_ids) == sorted(set(config.target_layer_ids)):
        return None
    return (f"it requires strictly increasing target_layer_ids, got {config.target_layer_ids}.",
            "retrain with the taps in increasing order (the order of fc's input blocks is part of the weights).")


def _plain_layers(config: DSparkConfig, contract: EngineContract):
    if not contract.plain_layers:
        return None
    rope = (config.rope_parameters or {}).get("rope_type", "default")
    odd = [f"hidden_act={config.hidden_act!r}"] * (config.hidden_act != "silu")
    odd += ["attention_bias=True"] * bool(config.attention_bias) + [f"rope_type={rope!r}"] * (rope != "default")
    if not odd:
        return None
    return (f"its draft layers are fixed Qwen3 layers (SiLU MLP, no attention bias, default RoPE), and this drafter "
            f"has {', '.join(odd)}.", "retrain with the target-family defaults above, or export with --engine vllm.")


_CHECKS = (_layout, _head, _draft_vocab, _confidence, _qk_norm, _mask, _taps, _taps_order, _plain_layers)

_SIDECARS_VLLM = (
    "vLLM reads neither file: it profiles its own draft and verify cost tables on the serving GPU "
    "(`dspark_sps_curve: \"auto\"`) instead of step_curve.json, and instead of calibration.json it either runs "
    "uncalibrated, takes one scalar `dspark_confidence_temperature`, or refits per-position temperatures online "
    "from identity (`dspark_online_sts`)."
)

VLLM = register_engine_contract(EngineContract(
    name="vllm",
    title="vLLM",
    sources=(
        ContractSource("vllm-project/vllm", "vllm/model_executor/models/qwen3_dspark.py", "0302ff40",
                       "Qwen3DSparkForCausalLM.load_weights: pruned lm_head + d2t required for a draft vocabulary, "
                       "t2d skipped, mask_embedding dropped, markov_w2 [V_draft, r], "
                       "confidence_head_with_markov defaults to false (at 47bd6d7c an enabled confidence head "
                       "without its tensors is an error)"),
        ContractSource("vllm-project/vllm", "vllm/model_executor/models/qwen3_dflash.py", "036a00d1",
                       "draft layers always apply q/k RMSNorms; causality from is_causal / dflash_config.causal / "
                       "layer_types; z-lab DFlash checkpoints served by the DFlash class"),
        ContractSource("vllm-project/vllm", "vllm/v1/worker/gpu/spec_decode/dspark/speculator.py", "6534e066",
                       "anchor-first unless dspark_bonus_anchor (other stored versions, e.g. 02957b5a, read "
                       "sample_from_anchor, default true: both are written); num_speculative_tokens slots from the "
                       "launch flag, not from block_size"),
    ),
    dflash_architecture="DFlashDraftModel",
    required_keys=("target_layer_ids", "mask_token_id", "markov_rank", "enable_confidence_head", "block_size",
                   "head_dim", "draft_vocab_size"),
    head_types=("markov", "none"),
    draft_vocab=True,
    reads_causality=True,
    gamma_from="the launch flag `num_speculative_tokens` (the config's block_size is not read for γ)",
    sidecars=_SIDECARS_VLLM,
    min_versions=(
        "vLLM with the DSpark method (`Qwen3DSparkModel`, vllm-project/vllm#47093, merged July 2026); anchor + γ "
        "masks drafters go to its DFlash method instead.",
    ),
))

SGLANG = register_engine_contract(EngineContract(
    name="sglang",
    title="SGLang",
    sources=(
        ContractSource("sgl-project/sglang", "python/sglang/srt/models/qwen3_dspark.py", "2dd29f7b",
                       "required head_dim, target_layer_ids, block_size, num_hidden_layers, mask_token_id; every "
                       "parameter must receive a tensor (embed_tokens and lm_head included: the class owns its "
                       "vocabulary weights) and unknown tensors raise; norm.weight loads into shared_head.norm; "
                       "markov_w2 [V, r] (no draft vocabulary, no d2t); the confidence head needs markov_rank > 0 "
                       "and confidence_head_with_markov; no layout flag read"),
        ContractSource("sgl-project/sglang", "python/sglang/srt/speculative/dspark_worker_v2.py", "028b6e61",
                       "block_size of the config is γ (anchor-first drafts), verify stride γ + 1; "
                       "--speculative-num-draft-tokens only warns on a mismatch; this version ties the target's "
                       "embed_tokens and lm_head over the draft's (later ones keep the draft's own, so the export "
                       "ships copies of the target's); confidence gate off unless "
                       "SGLANG_DSPARK_USE_CONFIDENCE_GATE"),
    ),
    dflash_architecture="DFlashDraftModel",
    required_keys=("head_dim", "target_layer_ids", "block_size", "num_hidden_layers", "mask_token_id",
                   "markov_rank", "enable_confidence_head"),
    forbidden_keys=("draft_vocab_size",),
    head_types=("markov", "none"),
    embed_tokens="required",
    confidence_needs_markov=True,
    embedding_tap=False,
    gamma_from="the config's block_size (`--speculative-num-draft-tokens` must equal it or SGLang warns and "
               "ignores the flag)",
    sidecars=("SGLang reads neither file: it gates drafts on the raw confidence against "
              "`--speculative-dspark-confidence-threshold` only when SGLANG_DSPARK_USE_CONFIDENCE_GATE=1 (off by "
              "default), with no temperature scaling and no cost model."),
))

SPECULATORS_CONTRACT = register_engine_contract(EngineContract(
    name="speculators",
    title="speculators",
    sources=(
        ContractSource("vllm-project/speculators", "src/speculators/models/dspark/config.py", "c05b95b3",
                       "DSparkSpeculatorConfig: speculators_model_type dspark, architectures DSparkSpeculator, "
                       "sample_from_anchor (default true), markov_rank / markov_head_type vanilla|gated|rnn, "
                       "enable_confidence_head, confidence_head_with_markov"),
        ContractSource("vllm-project/speculators", "src/speculators/models/dflash/config.py", "c05b95b3",
                       "transformer_layer_config, draft_vocab_size, block_size (slots), "
                       "aux_hidden_state_layer_ids, mask_token_id"),
        ContractSource("vllm-project/speculators", "src/speculators/model.py", "c05b95b3",
                       "DraftVocabMixin: t2d [V] bool, d2t [V_draft] long, lm_head [V_draft, d]; embed_tokens "
                       "filled from the verifier"),
        ContractSource("vllm-project/speculators", "src/speculators/convert/dflash/converter.py", "c05b95b3",
                       "aux_hidden_state_layer_ids = decoder-layer ids + 1 (hidden_states indices)"),
    ),
    config_format=SPECULATORS,
    anchor_first_architecture="DSparkSpeculator",
    dflash_architecture="DSparkSpeculator",  # sample_from_anchor=false is a native speculators DSpark layout
    layout_keys=("sample_from_anchor",),
    nested_layout_keys=False,
    head_types=("markov", "rnn", "none"),
    draft_vocab=True,
    writes_t2d=True,
    embed_tokens="absent",
    gamma_from="speculators_config.proposal_methods[0].speculative_tokens (vLLM: the launch flag "
               "`num_speculative_tokens`)",
    sidecars=("speculators trains and reads neither file; vLLM serving a speculators folder behaves as under "
              "--engine vllm (own cost tables, online STS)."),
    notes=("vLLM serves speculators DSpark folders with the vanilla head only, and reads their sample_from_anchor "
           "only from its #48639 on (older versions assume the 1 + N block for every speculators folder).",),
    min_versions=(
        "speculators >= 0.7.0 (its first DSpark release: `DSparkSpeculatorConfig`, sample_from_anchor #760, the "
        "Markov prev-token alignment #806); loading checked with speculators 0.9.0 `SpeculatorModel.from_pretrained` "
        "(0.7.0 reads the same fields and tensors; run it with the transformers it pins, < 5.15).",
        "vLLM with vllm-project/vllm#48639 (merged July 2026), which reads a speculators folder's "
        "sample_from_anchor: older builds (speculators DSpark since #47093) serve every speculators DSpark folder "
        "as 1 + N, so an anchor-first drafter's drafts are shifted by one position, silently (acceptance "
        "collapses, no error).",
    ),
))

DEEPSPEC = register_engine_contract(EngineContract(
    name="deepspec",
    title="DeepSpec",
    sources=(
        ContractSource("deepseek-ai/DeepSpec", "deepspec/modeling/dspark/qwen3/config.py", "afdfa7c9",
                       "Qwen3DSparkModel over a copy of the target config: block_size = γ, mask_token_id, "
                       "target_layer_ids, num_anchors, markov_rank / markov_head_type, enable_confidence_head, "
                       "confidence_head_with_markov; anchor-first only, no layout field"),
        ContractSource("deepseek-ai/DeepSpec", "deepspec/modeling/dspark/common.py", "afdfa7c9",
                       "tap -1 = embedding output (hidden_states[0]); taps strictly increasing"),
        ContractSource("deepseek-ai/DeepSpec", "deepspec/modeling/dspark/qwen3/modeling.py", "afdfa7c9",
                       "q/k RMSNorms, own embed_tokens / lm_head [V, d], fc, hidden_norm, markov_head.*, "
                       "confidence_head.proj"),
    ),
    required_keys=("block_size", "mask_token_id", "target_layer_ids", "num_target_layers", "num_anchors",
                   "markov_rank", "enable_confidence_head"),
    forbidden_keys=("draft_vocab_size",),
    head_types=("markov", "rnn", "none"),
    embed_tokens="required",
    increasing_taps=True,
    gamma_from="the config's block_size (its evaluator always builds anchor-first blocks)",
    sidecars="DeepSpec's evaluator reads neither file (it decodes with fixed block lengths).",
))


__all__ = [
    "DEEPSPEC",
    "ENGINE_CONTRACTS",
    "SGLANG",
    "SPECULATORS_CONTRACT",
    "VLLM",
    "ContractSource",
    "EngineContract",
    "Refusal",
    "get_contract",
    "refusals",
    "register_engine_contract",
]
