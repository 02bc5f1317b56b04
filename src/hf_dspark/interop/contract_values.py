"""The values an engine derives from an export, checked against what the drafter computes (`check_export`).

- Draft ids: the engine maps draft index i to target id `i + d2t[i]` (vLLM, speculators) and speculators rebuilds
  its verifier head from the `t2d` mask in increasing id order; the ids must be distinct, in the vocabulary, agree
  with `t2d`, and (given the drafter) equal `drafter.draft_token_ids()`.
- Rows: `lm_head.weight` row i must be the target's LM-head row at draft id i, and `embed_tokens.weight` the
  target's embedding (given the target; compared exactly after the export's cast).
- Taps: the hidden states the engine feeds the drafter, resolved as vLLM resolves them (`eagle3_utils`:
  `eagle_aux_hidden_state_layer_ids` used as-is, then `dflash_config.target_layer_ids`, `dspark_target_layer_ids`,
  `target_layer_ids`, each + 1; a speculators folder's `aux_hidden_state_layer_ids` becomes the eagle key). Every
  spelling present must agree, and (given the drafter) name its `target_layer_ids`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from .contracts import SPECULATORS, EngineContract
from .layout_flags import NESTED
from .weights import weight_files

EAGLE_TAPS = "eagle_aux_hidden_state_layer_ids"
SHIFTED_TAPS = (f"{NESTED}.target_layer_ids", "dspark_target_layer_ids", "target_layer_ids")  # decoder ids: + 1


def _get(raw: dict[str, Any], key: str) -> Any:
    node: Any = raw
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _read(folder: Path, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    found = {}
    for file in weight_files(folder):
        with safe_open(file, framework="pt") as handle:
            for name in names:
                if name in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                    found[name] = handle.get_tensor(name)
    return found


def resolved_taps(raw: dict[str, Any], contract: EngineContract) -> tuple[list[int] | None, list[str]]:
    """Decoder-layer ids the engine taps (hidden_states index − 1; −1 is the embedding output), and the problems:
    spellings that disagree with the one the engine reads, ids outside the target."""
    if contract.config_format == SPECULATORS:
        spellings = {"aux_hidden_state_layer_ids": raw.get("aux_hidden_state_layer_ids")}
        hidden = {k: list(v) for k, v in spellings.items() if v}
        layers = raw.get("transformer_layer_config") or {}
    else:
        hidden = {EAGLE_TAPS: list(raw[EAGLE_TAPS])} if raw.get(EAGLE_TAPS) else {}
        hidden |= {k: [int(i) + 1 for i in _get(raw, k)] for k in SHIFTED_TAPS if _get(raw, k)}
        layers = raw
    if not hidden:
        return None, ["no target layer ids are declared"]
    read, taps = next(iter(hidden.items()))
    problems = [f"{key} names hidden states {other}, but the engine reads {read} = {taps}"
                for key, other in hidden.items() if other != taps]
    depth = layers.get("num_target_layers")
    if depth is not None and any(not 0 <= i <= int(depth) for i in taps):
        problems.append(f"{read} = {taps} reaches outside the target's hidden states 0..{depth}")
    return [i - 1 for i in taps], problems


def _draft_ids(tensors: dict[str, torch.Tensor], vocab: int, increasing: bool) -> tuple[torch.Tensor, list[str]]:
    """Target ids of the draft vocabulary as the engine derives them (`i + d2t[i]`), and their problems."""
    if "d2t" not in tensors:
        return torch.arange(vocab), []
    d2t = tensors["d2t"].long()
    ids = torch.arange(d2t.numel()) + d2t
    problems = []
    if bool(((ids < 0) | (ids >= vocab)).any()) or ids.unique().numel() != ids.numel():
        problems.append(f"i + d2t[i] gives ids outside 0..{vocab - 1} or repeated ones")
    elif increasing and not bool((ids[1:] > ids[:-1]).all()):
        problems.append("i + d2t[i] is not increasing: speculators rebuilds the verifier head in t2d order")
    if "t2d" in tensors and not torch.equal(tensors["t2d"].bool().nonzero().flatten(), ids.sort().values):
        problems.append("t2d does not mark exactly the draft ids i + d2t[i]")
    return ids, problems


def _row_problems(tensors: dict[str, torch.Tensor], ids: torch.Tensor, target) -> list[str]:
    problems = []
    for name, module in (("lm_head.weight", target.get_output_embeddings()),
                         ("embed_tokens.weight", target.get_input_embeddings())):
        if name not in tensors:
            continue
        written = tensors[name]
        rows = module.weight.detach().to("cpu")
        rows = rows[ids] if name == "lm_head.weight" else rows
        if rows.shape != written.shape or not torch.equal(rows.to(written.dtype), written):
            what = "the target's LM-head rows at the draft ids" if name == "lm_head.weight" else "the target's"
            problems.append(f"tensor {name} is not {what}")
    return problems


def value_problems(folder: Path, raw: dict[str, Any], shape: dict[str, Any], contract: EngineContract,
                   target=None, drafter=None) -> list[str]:
    """Every value the engine would derive differently from what the drafter computes (see the module docstring)."""
    taps, problems = resolved_taps(raw, contract)
    if drafter is not None and taps is not None and taps != list(drafter.config.target_layer_ids):
        problems.append(f"the engine taps decoder layers {taps}, the drafter reads {drafter.config.target_layer_ids}")
    if shape["dflash"]:
        return problems  # backbone tensors only: no vocabulary rows
    tensors = _read(folder, ("d2t", "t2d", "lm_head.weight", "embed_tokens.weight"))
    ids, found = _draft_ids(tensors, int(shape["vocab"]), increasing=contract.writes_t2d)
    problems += found
    if found:
        return problems
    if drafter is not None:
        own = drafter.draft_token_ids()
        own = torch.arange(int(shape["vocab"])) if own is None else own.to("cpu").long()
        if not torch.equal(ids, own):
            problems.append("the draft ids i + d2t[i] are not the drafter's draft vocabulary")
    if target is not None:
        problems += _row_problems(tensors, ids, target)
    return problems


__all__ = ["resolved_taps", "value_problems"]
