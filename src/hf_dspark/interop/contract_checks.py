"""`check_export`: does a written folder satisfy an engine's loader (interop/contracts.py)?

Applied by the tests to exports of every head / layout / draft-vocabulary combination, and available to users who
write engine folders by other means. It reads `config.json` and the safetensors headers, and with the target (and
the drafter) the values the engine derives from them (interop/contract_values.py): draft ids, vocabulary rows, taps.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from safetensors import safe_open

from ..model.heads import find_exported_head, get_head
from .contract_values import value_problems
from .contracts import SPECULATORS, EngineContract, get_contract
from .layout_flags import NESTED, declared_layouts, layout_name
from .layouts import load_json_object
from .weights import weight_files

_LAYER = re.compile(
    r"layers\.\d+\.(self_attn\.[qkvo]_proj\.(weight|bias)|self_attn\.[qk]_norm\.weight|mlp\.(gate|up|down)_proj\."
    r"weight|(input|post_attention)_layernorm\.weight)"
)
BACKBONE = ("fc.weight", "hidden_norm.weight", "norm.weight")
_TORCH_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "I64": "int64", "BOOL": "bool"}
# Fields whose engine default differs between versions (or from hf-dspark's): an export spells them out.
EXPLICIT_LAYER_KEYS = ("rope_theta", "hidden_act")
# speculators' own save_pretrained writes its model class; its config class defaults to the speculator name.
SPECULATORS_ARCHITECTURES = (["DSparkSpeculator"], ["DSparkDraftModel"])
# What speculators' DFlash core reads from transformer_layer_config as attributes (no default in some versions).
SPECULATORS_LAYER_KEYS = ("sliding_window", "layer_types", "is_causal", *EXPLICIT_LAYER_KEYS)


def _headers(folder: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    found = {}
    for file in weight_files(folder):
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                piece = handle.get_slice(name)
                found[name] = (tuple(piece.get_shape()), _TORCH_DTYPES.get(piece.get_dtype(), piece.get_dtype()))
    return found


def _get(raw: dict[str, Any], key: str) -> Any:
    node: Any = raw
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _unwritten(raw: dict[str, Any], key: str) -> bool:
    """Whether `key` has no explicit value (`rope_theta` also counts inside `rope_parameters`, as transformers 5
    writes it)."""
    if key == "rope_theta" and _get(raw, "rope_parameters.rope_theta") is not None:
        return False
    return raw.get(key) is None


def check_export(folder: str | Path, engine: str | EngineContract, target=None, drafter=None) -> list[str]:
    """Every way the folder breaks `engine`'s loading rules (empty: it loads and serves as exported).

    Args:
        folder: the export (config.json and safetensors).
        engine: a registered engine name or contract.
        target: the target model; when given, `lm_head` / `embed_tokens` must hold its rows at the draft ids.
        drafter: the drafter exported; when given, the draft ids and the taps the engine resolves must be its own.
    """
    contract = get_contract(engine)
    folder = Path(folder)
    raw = load_json_object(folder / "config.json")
    tensors = _headers(folder)
    if contract.config_format == SPECULATORS:
        shape, problems = _speculators_shape(raw)
    else:
        shape, problems = _dspark_shape(raw, contract)
    if shape is None:
        return problems
    problems += _tensor_problems(tensors, shape, contract)
    return problems + value_problems(folder, raw, shape, contract, target=target, drafter=drafter)


def _layout_problems(raw: dict[str, Any], contract: EngineContract) -> tuple[bool | None, list[str]]:
    declared = declared_layouts(raw)
    problems = []
    wanted = [*contract.layout_keys, *(f"{NESTED}.{k}" for k in contract.layout_keys if contract.nested_layout_keys)]
    missing = [k for k in wanted if k not in declared]
    if missing:
        problems.append(f"layout spellings {missing} are missing (the engine family reads them)")
    values = set(declared.values())
    if len(values) > 1:
        problems.append(f"the layout spellings disagree: {declared}")
    return (values.pop() if len(values) == 1 else None), problems


def _dspark_shape(raw: dict[str, Any], contract: EngineContract) -> tuple[dict[str, Any] | None, list[str]]:
    """The shapes implied by a DSpark-format (or DFlash-architecture) config, and its config problems."""
    anchor_first, problems = _layout_problems(raw, contract)
    arch = (raw.get("architectures") or [None])[0]
    if anchor_first is None:
        return None, [*problems, "no single block layout is declared"]
    if arch != contract.architecture(anchor_first):
        problems.append(f"architectures[0] is {arch!r}; {contract.title} loads a {layout_name(anchor_first)} "
                        f"drafter as {contract.architecture(anchor_first)!r}")
    is_dflash = arch == "DFlashDraftModel"
    required = ("dflash_config.target_layer_ids", "dflash_config.mask_token_id", "block_size") if is_dflash else (
        contract.required_keys)
    problems += [f"required config key {k!r} is missing" for k in required if _get(raw, k) is None]
    problems += [f"config key {k!r} must not be written for {contract.title}" for k in contract.forbidden_keys
                 if _get(raw, k) is not None]
    if not is_dflash and "confidence_head_with_markov" not in raw:
        problems.append("confidence_head_with_markov is not written (vLLM assumes false, DeepSpec and speculators "
                        "true): write it explicitly")
    problems += [f"{k} is not written (the engines' defaults differ): write it explicitly"
                 for k in EXPLICIT_LAYER_KEYS if _unwritten(raw, k)]
    if contract.reads_causality:
        problems += _causal_problems(raw)
    if arch and arch.endswith("DSparkModel") and not anchor_first:
        problems.append("a 1 + N drafter under a *DSparkModel architecture is served one position shifted")
    rank = 0 if is_dflash else int(raw.get("markov_rank") or 0)
    vocab = int(raw.get("vocab_size") or 0)
    shape = {
        "vocab": vocab, "draft_vocab": int(raw.get("draft_vocab_size") or vocab), "hidden": raw.get("hidden_size"),
        "rank": rank, "head": raw.get("markov_head_type") if rank else None, "dflash": is_dflash,
        "layers": raw.get("num_hidden_layers"), "taps": len(_get(raw, "dflash_config.target_layer_ids") or
                                                        raw.get("target_layer_ids") or []),
        "confidence": bool(raw.get("enable_confidence_head")) and not is_dflash,
        "confidence_markov": bool(raw.get("confidence_head_with_markov")), "dtype": raw.get("dtype"),
    }
    return shape, problems


def _causal_problems(raw: dict[str, Any]) -> list[str]:
    """Draft layers the engine would run with causal block attention (`is_causal`, then `dflash_config.causal`,
    then `layer_types[i] == "sliding_attention"`); hf-dspark's blocks attend bidirectionally."""
    nested = raw.get(NESTED) if isinstance(raw.get(NESTED), dict) else {}
    for key, value in (("is_causal", raw.get("is_causal")), (f"{NESTED}.causal", nested.get("causal"))):
        if value is not None:
            return [] if value is False else [f"{key} is {value!r}: the engine would run causal block attention"]
    problems = [f"neither is_causal nor {NESTED}.causal is written (engine versions differ on the default): write "
                f"{NESTED}.causal: false explicitly"]
    sliding = [i for i, kind in enumerate(raw.get("layer_types") or []) if kind == "sliding_attention"]
    if sliding:
        problems.append(f"layer_types marks draft layers {sliding} sliding_attention, which the engine runs causal")
    return problems


def _speculators_shape(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    problems = []
    if raw.get("speculators_model_type") != "dspark" or raw.get("architectures") not in SPECULATORS_ARCHITECTURES:
        problems.append("speculators_model_type must be 'dspark' with architectures ['DSparkSpeculator'] (or "
                        "['DSparkDraftModel'], as speculators' save_pretrained writes)")
    layers = raw.get("transformer_layer_config")
    if not isinstance(layers, dict):
        return None, [*problems, "transformer_layer_config (the draft layers' HF config) is missing"]
    problems += [f"transformer_layer_config.{k} is not written (speculators reads it as an attribute, vLLM copies "
                 "it into the draft config): write it explicitly" for k in SPECULATORS_LAYER_KEYS
                 if (k not in layers if k == "sliding_window" else _unwritten(layers, k))]
    if layers.get("is_causal") is True or any(t != "full_attention" for t in layers.get("layer_types") or []):
        problems.append("transformer_layer_config declares causal or sliding draft layers; hf-dspark blocks attend "
                        "bidirectionally over the full context")
    for key in ("draft_vocab_size", "block_size", "aux_hidden_state_layer_ids", "mask_token_id", "sample_from_anchor",
                "markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"):
        if raw.get(key) is None:
            problems.append(f"required config key {key!r} is missing")
    if raw.get("markov_head_type") not in ("vanilla", "gated", "rnn"):
        problems.append(f"markov_head_type {raw.get('markov_head_type')!r} is not vanilla, gated or rnn")
    spec = raw.get("speculators_config") or {}
    methods = spec.get("proposal_methods") or [{}]
    gamma = int(raw.get("block_size") or 0) - (0 if raw.get("sample_from_anchor") else 1)
    if spec.get("algorithm") != "dspark" or methods[0].get("speculative_tokens") != gamma:
        problems.append(f"speculators_config must name algorithm 'dspark' with speculative_tokens = γ = {gamma}")
    if not (spec.get("verifier") or {}).get("name_or_path"):
        problems.append("speculators_config.verifier.name_or_path is missing")
    rank = int(raw.get("markov_rank") or 0)
    vocab = int(layers.get("vocab_size") or 0)
    shape = {
        "vocab": vocab, "draft_vocab": int(raw.get("draft_vocab_size") or vocab), "hidden": layers.get("hidden_size"),
        "rank": rank, "head": raw.get("markov_head_type") if rank else None, "dflash": False,
        "layers": layers.get("num_hidden_layers"), "taps": len(raw.get("aux_hidden_state_layer_ids") or []),
        "confidence": bool(raw.get("enable_confidence_head")),
        "confidence_markov": bool(raw.get("confidence_head_with_markov")), "dtype": raw.get("dtype"),
    }
    return shape, problems


def _expected(shape: dict[str, Any], contract: EngineContract) -> dict[str, tuple[int, ...] | None]:
    """name -> shape (None: any) of the non-layer tensors the engine loads; absent names are unknown to it."""
    v, vd, d, r = shape["vocab"], shape["draft_vocab"], shape["hidden"], shape["rank"]
    expected: dict[str, tuple[int, ...] | None] = {"fc.weight": (d, shape["taps"] * d), "hidden_norm.weight": (d,),
                                                    "norm.weight": (d,)}
    if shape["dflash"]:
        return expected
    expected["lm_head.weight"] = (vd, d)
    if contract.embed_tokens != "absent":
        expected["embed_tokens.weight"] = (v, d)
    if vd < v and contract.draft_vocab:
        expected["d2t"] = (vd,)
        if contract.writes_t2d:
            expected["t2d"] = (v,)
    if r:  # a head type hf-dspark does not implement (an engine's "gated") is checked for the W1 / W2 it shares
        head = find_exported_head(shape["head"], r) or get_head("markov")
        expected |= head.parameter_shapes(v, vd, r, d)
    if shape["confidence"]:
        expected |= {"confidence_head.proj.weight": (1, d + (r if shape["confidence_markov"] else 0)),
                     "confidence_head.proj.bias": (1,)}
    return expected


def _tensor_problems(tensors: dict[str, tuple[tuple[int, ...], str]], shape: dict[str, Any],
                     contract: EngineContract) -> list[str]:
    expected = _expected(shape, contract)
    problems = []
    optional = {"embed_tokens.weight"} if contract.embed_tokens == "optional" or shape["dflash"] else set()
    if contract.config_format == SPECULATORS:  # what speculators' own saves hold or leave out
        expected["embed_tokens.weight"] = (shape["vocab"], shape["hidden"])
        optional.add("embed_tokens.weight")  # saved by speculators 0.7, not by 0.9 (both refill it from the verifier)
        if shape["draft_vocab"] == shape["vocab"]:
            optional.add("lm_head.weight")  # its full-vocabulary saves rebuild it from the verifier
    for name, want in expected.items():
        if name not in tensors:
            if name not in optional:
                problems.append(f"tensor {name} is missing")
        elif want is not None and tensors[name][0] != want:
            problems.append(f"tensor {name} has shape {list(tensors[name][0])}, the engine builds {list(want)}")
    unknown = sorted(n for n in tensors if n not in expected and not _LAYER.fullmatch(n))
    if unknown:
        problems.append(f"tensors the engine has no destination for: {unknown[:6]}")
    norms = [n for n in tensors if n.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight"))]
    if contract.needs_qk_norm and len(norms) != 2 * int(shape["layers"] or 0):
        problems.append("the draft layers lack the q/k RMSNorm weights the engine's layers always apply")
    floats = {dtype for _, dtype in tensors.values() if dtype not in ("int64", "bool")}
    if floats != {shape["dtype"]}:
        problems.append(f"floating-point tensors are {sorted(floats)}, config.json says dtype {shape['dtype']!r}")
    if "d2t" in tensors and tensors["d2t"][1] != "int64":
        problems.append("d2t must be int64 offsets (target id = draft id + d2t[draft id])")
    return problems


__all__ = ["check_export"]
