"""Target features for training (docs/method.md, section 6) behind one interface, `TargetFeatureProvider`.

* online (default): the frozen target runs in the training process under `torch.no_grad` and returns only the
  tapped decoder-layer outputs (concatenated, `[S, L, n·d]`) and the final normed hidden state (`[S, L, d]`).
* offline: the same tensors read from a safetensors shard cache (bf16) written once by `build_feature_cache`.
  The cache's `manifest.json` records the target name and fingerprint, the layer ids, the dtype and the dataset
  fingerprint; a cache built for another target, other layers or other data is refused, never overwritten.

The target's logits for the TV loss are never stored: `target_logits_at` applies the frozen LM head to the final
hidden state at the block positions only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from tqdm.auto import tqdm
from transformers.utils import logging

from ..io_utils import write_json_atomic

logger = logging.get_logger(__name__)

MANIFEST = "manifest.json"
CACHE_FORMAT = 1


@dataclass
class TargetFeatures:
    """tapped_hidden `[S, L, n·d]` (layer outputs in `layer_ids` order); final_hidden `[S, L, d]` (after the norm)."""

    tapped_hidden: torch.Tensor
    final_hidden: torch.Tensor


@torch.no_grad()
def compute_target_features(
    target: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer_ids: Sequence[int]
) -> TargetFeatures:
    """Run the frozen target's decoder once; hidden_states index i+1 is decoder layer i's output (before the norm)."""
    decoder = target.base_model if target.base_model is not target else None
    selected = [i + 1 for i in layer_ids]
    if decoder is not None:
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=selected,
                      use_cache=False)
        final = out.last_hidden_state
    else:  # a model without a separate base model: ask for the normed last state and one logit row only
        num_layers = target.config.get_text_config().num_hidden_layers
        out = target(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=1,
                     output_hidden_states=[*selected, num_layers])
        final = out.hidden_states[num_layers]
    tapped = torch.cat([out.hidden_states[i] for i in selected], dim=-1)
    return TargetFeatures(tapped, final)


@torch.no_grad()
def target_logits_at(final_hidden: torch.Tensor, positions: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
    """The target's logits predicting token a+k+1, i.e. lm_head(final_hidden[a+k]), at block positions only.

    final_hidden: `[S, L, d]`; positions: `[S, N, γ]` long (a+k; out-of-range entries are clamped, mask them via
    the labels). Returns float32 `[S, N, γ, V]`.
    """
    seqs, length, dim = final_hidden.shape
    index = positions.clamp(0, length - 1).reshape(seqs, -1, 1).expand(-1, -1, dim)
    gathered = final_hidden.gather(1, index).to(lm_head.weight.dtype)
    return lm_head(gathered).float().view(*positions.shape, -1)


@torch.no_grad()
def target_probs_at(
    final_hidden: torch.Tensor,
    positions: torch.Tensor,
    valid: torch.Tensor,
    lm_head: nn.Module,
    draft_token_ids: torch.Tensor | None = None,
    chunk: int = 1024,
) -> torch.Tensor:
    """p_target for every labelled block slot: softmax(lm_head(final_hidden[a+k])) over the FULL vocabulary, kept
    on the drafter's vocabulary (`draft_token_ids`, or all of V), each distinct position computed once.

    With dense anchors the γ slots of overlapping blocks share positions (slot k of the block at a is slot k−1 of
    the block at a+1), so the LM head runs once per distinct position instead of once per slot.
    final_hidden: `[S, L, d]`; positions: long `[S, N, γ]` (a+k); valid: bool `[S, N, γ]`. Returns float32
    `[S, N, γ, V_d]`, zero at invalid slots.
    """
    seqs, length, dim = final_hidden.shape
    flat = torch.arange(seqs, device=positions.device)[:, None, None] * length + positions.clamp(0, length - 1)
    unique, inverse = torch.unique(flat[valid], return_inverse=True)
    hidden = final_hidden.reshape(seqs * length, dim)[unique].to(lm_head.weight.dtype)
    vocab_d = lm_head.weight.shape[0] if draft_token_ids is None else draft_token_ids.numel()
    probs = torch.empty(unique.numel(), vocab_d, dtype=torch.float32, device=final_hidden.device)
    for start in range(0, unique.numel(), chunk):
        p_full = torch.softmax(lm_head(hidden[start : start + chunk]).float(), dim=-1)
        probs[start : start + chunk] = p_full if draft_token_ids is None else p_full[:, draft_token_ids]
    out = probs.new_zeros(*positions.shape, vocab_d)
    out[valid] = probs[inverse]
    return out


def target_fingerprint(target: nn.Module) -> str:
    """sha256 of the target's architecture config and a bf16-rounded sample of its weights (dtype-independent)."""
    config = target.config.to_dict()
    for key in ("_name_or_path", "transformers_version", "dtype", "torch_dtype", "_commit_hash"):
        config.pop(key, None)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    params = list(target.named_parameters())
    for name, param in params[:: max(1, len(params) // 16)]:
        digest.update(name.encode())
        digest.update(param.detach().flatten()[:512].to(torch.bfloat16).float().cpu().numpy().tobytes())
    return digest.hexdigest()[:32]


def dataset_fingerprint(dataset: Sequence[Mapping[str, Any]]) -> str:
    """sha256 over every example's sample_index and input_ids."""
    digest = hashlib.sha256()
    for example in dataset:
        digest.update(f"{example['sample_index']}:{list(example['input_ids'])};".encode())
    return digest.hexdigest()[:32]


class TargetFeatureProvider:
    """Callable `provider(batch) -> TargetFeatures` for a collated batch (`input_ids`, `attention_mask`, and
    `sample_index` for the offline cache). Build one with `TargetFeatureProvider.online(...)` or `.offline(...)`."""

    layer_ids: list[int]

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> TargetFeatures:
        raise NotImplementedError

    @staticmethod
    def online(target: nn.Module, layer_ids: Sequence[int]) -> OnlineFeatureProvider:
        return OnlineFeatureProvider(target, layer_ids)

    @staticmethod
    def offline(
        cache_dir: str | Path, target: nn.Module | None = None, layer_ids: Sequence[int] | None = None
    ) -> OfflineFeatureProvider:
        return OfflineFeatureProvider(cache_dir, target, layer_ids)


class OnlineFeatureProvider(TargetFeatureProvider):
    """The frozen target in-process; its parameters are set to `requires_grad=False`."""

    def __init__(self, target: nn.Module, layer_ids: Sequence[int]) -> None:
        self.target = target.eval().requires_grad_(False)
        self.layer_ids = list(layer_ids)

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> TargetFeatures:
        return compute_target_features(self.target, batch["input_ids"], batch["attention_mask"], self.layer_ids)


def read_manifest(cache_dir: str | Path) -> dict[str, Any] | None:
    path = Path(cache_dir) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def _write_manifest(cache_dir: Path, manifest: dict[str, Any]) -> None:
    write_json_atomic(cache_dir / MANIFEST, manifest, indent=1)


def check_manifest(manifest: dict[str, Any], expected: Mapping[str, Any], cache_dir: Path) -> None:
    """Raise ValueError naming every field where a cache differs from what this run needs."""
    diffs = [f"{k}: cache has {manifest.get(k)!r}, this run needs {v!r}" for k, v in expected.items()
             if manifest.get(k) != v]
    if diffs:
        raise ValueError(
            f"the feature cache at {cache_dir} was built for something else ({'; '.join(diffs)}). It is left as it "
            "is: choose another --feature_cache_dir, or delete that folder to rebuild it."
        )


def build_feature_cache(
    target: nn.Module,
    dataset: Sequence[Mapping[str, Any]],
    cache_dir: str | Path,
    layer_ids: Sequence[int],
    batch_size: int = 4,
    samples_per_shard: int = 256,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Write (or resume) the offline cache of tapped + final hidden states for every example of `dataset`.

    Logs the size estimate before writing. Refuses a folder whose manifest names another target, other layers,
    another dtype or other data. Shards and the manifest are each written atomically.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    expected = {
        "format": CACHE_FORMAT,
        "target_fingerprint": target_fingerprint(target),
        "layer_ids": list(layer_ids),
        "dtype": str(dtype).removeprefix("torch."),
        "dataset_fingerprint": dataset_fingerprint(dataset),
    }
    manifest = read_manifest(cache_dir)
    if manifest is not None:
        check_manifest(manifest, expected, cache_dir)
    elif any(cache_dir.iterdir()):
        raise ValueError(f"{cache_dir} is not empty and has no {MANIFEST}; refusing to write a feature cache there.")
    else:
        manifest = {**expected, "target_name": str(getattr(target, "name_or_path", "")), "shards": {}}
    done = {i for ids in manifest["shards"].values() for i in ids}
    todo = [example for example in dataset if example["sample_index"] not in done]
    d = target.config.get_text_config().hidden_size
    tokens = sum(len(example["input_ids"]) for example in todo)
    size = tokens * (len(layer_ids) + 1) * d * torch.finfo(dtype).bits // 8
    logger.warning(f"feature cache {cache_dir}: {len(todo)} examples, {tokens} tokens, about {size / 2**30:.2f} GiB")
    device = next(target.parameters()).device
    with tqdm(total=len(todo), desc="caching target features", unit="seq") as bar:
        for start in range(0, len(todo), samples_per_shard):
            chunk = todo[start : start + samples_per_shard]
            tensors = {}
            for b in range(0, len(chunk), batch_size):
                group = chunk[b : b + batch_size]
                ids, mask = _right_pad([g["input_ids"] for g in group], device)
                feats = compute_target_features(target, ids, mask, layer_ids)
                for row, example in enumerate(group):
                    n, key = len(example["input_ids"]), str(example["sample_index"])
                    tensors[f"{key}.tapped"] = feats.tapped_hidden[row, :n].to(dtype).cpu().contiguous()
                    tensors[f"{key}.final"] = feats.final_hidden[row, :n].to(dtype).cpu().contiguous()
                bar.update(len(group))
            name = f"shard-{len(manifest['shards']):05d}.safetensors"
            tmp = cache_dir / f".{name}.tmp-{os.getpid()}"
            save_file(tensors, str(tmp))
            os.replace(tmp, cache_dir / name)
            manifest["shards"][name] = [int(e["sample_index"]) for e in chunk]
            _write_manifest(cache_dir, manifest)
    return cache_dir


def _right_pad(sequences: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), length, dtype=torch.long)
    mask = torch.zeros(len(sequences), length, dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    return ids.to(device), mask.to(device)


class OfflineFeatureProvider(TargetFeatureProvider):
    """Features read from a `build_feature_cache` folder, right-padded with zeros to the batch length."""

    def __init__(
        self, cache_dir: str | Path, target: nn.Module | None = None, layer_ids: Sequence[int] | None = None
    ) -> None:
        self.cache_dir = Path(cache_dir)
        manifest = read_manifest(self.cache_dir)
        if manifest is None:
            raise FileNotFoundError(
                f"no {MANIFEST} in {self.cache_dir}; build the cache first (build_feature_cache or feature_mode="
                "'offline' in train(), which builds it)."
            )
        expected: dict[str, Any] = {"format": CACHE_FORMAT}
        if target is not None:
            expected["target_fingerprint"] = target_fingerprint(target)
        if layer_ids is not None:
            expected["layer_ids"] = list(layer_ids)
        check_manifest(manifest, expected, self.cache_dir)
        self.layer_ids = list(manifest["layer_ids"])
        self.shard_of = {i: name for name, ids in manifest["shards"].items() for i in ids}
        self._handles: dict[str, Any] = {}

    def _load(self, sample_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        name = self.shard_of.get(sample_index)
        if name is None:
            raise KeyError(f"sample {sample_index} is not in the feature cache {self.cache_dir}; rebuild it.")
        if name not in self._handles:
            self._handles[name] = safe_open(str(self.cache_dir / name), framework="pt")
        handle = self._handles[name]
        return handle.get_tensor(f"{sample_index}.tapped"), handle.get_tensor(f"{sample_index}.final")

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> TargetFeatures:
        if "sample_index" not in batch:
            raise KeyError("offline features need 'sample_index' in the batch (DSparkCollator passes it through).")
        ids = batch["input_ids"]
        seqs, length = ids.shape
        loaded = [self._load(int(i)) for i in batch["sample_index"].tolist()]
        tapped = loaded[0][0].new_zeros(seqs, length, loaded[0][0].shape[-1])
        final = loaded[0][1].new_zeros(seqs, length, loaded[0][1].shape[-1])
        for row, (t, f) in enumerate(loaded):
            n = min(length, t.shape[0])
            tapped[row, :n], final[row, :n] = t[:n], f[:n]
        return TargetFeatures(tapped.to(ids.device), final.to(ids.device))
